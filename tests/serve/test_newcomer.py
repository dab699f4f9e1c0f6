"""A slow client cannot hold walla serve, and a newcomer's first minutes (issue 48, items 6 and 7): the
market's slow-client guard in front of the API, a two-key error that names only flags walla serve has, the
first question's pass paid at start-up, and each load step printed with its time."""

from __future__ import annotations

import re
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest
from serve_fixtures import OP_TOKEN
from trained_market import train_more
from walla.cli.lazy import run
from walla.cli.main import app as root
from walla.market.api import ConnectionLimits
from walla.market.ledger import Ledger
from walla.market.local import free_port
from walla.serve.app import create_serve_app
from walla.serve.forecast import Forecaster
from walla.serve.loading import ServeConfig, load_pool

ROOT = Path(__file__).resolve().parents[2]


def test_headers_never_finished_get_408_from_the_guard(served_pool, tmp_path):
    from walla.serve.command import http_server  # issue 48's: here so the other tests run without it

    ledger = Ledger.open(str(tmp_path / "serve.db"))
    fc = Forecaster(served_pool, ledger).start()
    port = free_port()
    server = http_server(
        create_serve_app(fc, open_access=True, limits=ConnectionLimits(read_timeout=0.5)),
        "127.0.0.1",
        port,
        lifespan="off",
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
            t0 = time.monotonic()
            got = s.recv(4096)
        assert got.startswith(b"HTTP/1.1 408"), got
        assert time.monotonic() - t0 < 5
    finally:
        server.should_exit = True
        thread.join(10)
        fc.stop()
        ledger.close()


def test_two_run_keys_are_told_with_the_flag_serve_has(tiny_pool, tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(tiny_pool["runs"], runs)
    train_more(tiny_pool, runs, "walla-i", "walla.lr=0.003")
    with pytest.raises(ValueError, match="run keys, name one with --key KEY_ID: ") as e:
        load_pool(
            ServeConfig(scenario=tiny_pool["scenario"], runs=runs, store=tiny_pool["store"]),
            with_models=False,
        )
    assert "--run" not in str(e.value)


def test_warm_up_runs_every_model_and_head_and_records_nothing(served_pool, tmp_path):
    ledger = Ledger.open(str(tmp_path / "serve.db"))
    ledger.ensure_operator(OP_TOKEN)
    fc = Forecaster(served_pool, ledger).start()
    try:
        fc.warm_up()
        assert all(b.stats.passes == 1 for b in fc.batchers.values())
        assert ledger.counts()["rounds"] == 0
    finally:
        fc.stop()
        ledger.close()


def test_each_load_step_is_printed_with_its_time(tiny_pool, capsys):
    args = ["serve", "--runs", str(tiny_pool["runs"]), "--scenario", tiny_pool["scenario"]]
    args += ["--store", str(tiny_pool["store"]), "--check", "--limit", "2"]
    assert run(root, args, "walla") == 0
    err = capsys.readouterr().err
    for step in ("run walla-i/", "heads read from state.pt", "test questions read from the store", "model "):
        assert re.search(rf"walla serve: (\d+ )?{re.escape(step)}.* in \d+\.\d s", err), err


def test_the_readme_says_where_walla_is():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "source .venv/bin/activate" in readme and ".venv/bin/walla" in readme
