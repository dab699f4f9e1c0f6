"""benchmarks/market_load.py at a small size: concurrent agents, no lost or duplicated ledger rows, payouts
equal to their recomputation from the stored reports."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "market_load.py"


def _load_module():
    spec = importlib.util.spec_from_file_location("market_load", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_market_load_small(database, capsys):
    out = _load_module().main(
        ["--agents", "5", "--rounds", "24", "--wave", "8", "--in-process", "--db", database]
    )
    printed = capsys.readouterr().out
    assert out["problems"] == [], out["problems"]
    assert out["counts"]["reports"] == out["counts"]["payouts"] == 5 * 24
    assert out["counts"]["rounds"] == out["counts"]["resolutions"] == 24
    assert out["submissions"] >= 5 * 24 and out["max_diff"] <= 1e-12
    assert out["payout_sum"] <= out["bound_sum"]
    assert "reports/s" in printed and "p99" in printed and "audit: OK" in printed
