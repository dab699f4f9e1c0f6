"""Compute accounting in the report (issue 13): LLM compute per question per method, next to quality."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from eval_fixtures import LABEL, PROBS, SPLIT, write_run, write_scenario
from walla.evaluate.compute import agent_costs
from walla.evaluate.report import EvalConfig, run
from walla.evaluate.tables import to_markdown

TOKENS = {"alpha": 120.0, "beta": 80.0}
FLOPS = {"alpha": 2 * 135e6 * 120, "beta": 2 * 270e6 * 80}  # 2 x non-embedding params x tokens
COMPUTE = {
    "agents": [
        {"model": m, "tokens_per_question": TOKENS[m], "flops_per_question": FLOPS[m]}
        for m in ("alpha", "beta")
    ]
}
# a router that routes hard on q1, q3 (all weight on one agent) and softly elsewhere
HARD_W = np.array([[0.5, 0.5], [1.0, 0.0], [0.3, 0.7], [0.0, 1.0], [0.6, 0.4], [0.2, 0.8]])


def make_runs(root: Path, meta: dict | None, target=None) -> Path:
    runs = root / "runs"
    kw = {"target": target, "soft_target": target is not None}
    write_scenario(runs, "toy", PROBS, LABEL, SPLIT, ["alpha", "beta"], meta=meta, **kw)
    soft = np.array([[0.4, 0.6]] * 6)
    for seed in (1, 2):
        write_run(runs, "toy", "uniform", seed, np.full((6, 2), 0.5), PROBS.mean(1), SPLIT)
        write_run(runs, "toy", "route-llm", seed, soft, np.einsum("nm,nmk->nk", soft, PROBS), SPLIT)
        write_run(runs, "toy", "nirt-router", seed, HARD_W, np.einsum("nm,nmk->nk", HARD_W, PROBS), SPLIT)
    return runs


def _rows(path: Path, table: str) -> dict[tuple[str, str], dict]:
    return {(r["row"], r["metric"]): r for r in csv.DictReader(path.open()) if r["table"] == table}


def test_compute_table_and_plot(tmp_path):
    runs = make_runs(tmp_path, {"compute": COMPUTE})
    result = run(EvalConfig(report=tmp_path / "out" / "t.md", runs=runs, plots=True))
    rows = _rows(tmp_path / "out" / "t.csv", "compute")
    both = FLOPS["alpha"] + FLOPS["beta"]
    assert float(rows[("Agent 1: alpha", "gflops")]["mean"]) == pytest.approx(FLOPS["alpha"] / 1e9)
    assert float(rows[("Agent 2: beta", "tokens")]["mean"]) == pytest.approx(80.0)
    for method in ("UniformAvg", "RouteLLM"):  # pooling, and a router with soft weights: every agent
        assert float(rows[(method, "gflops")]["mean"]) == pytest.approx(both / 1e9)
        assert float(rows[(method, "agents_run")]["mean"]) == pytest.approx(2.0)
    # the hard-routed test questions (q1: alpha only, q3: beta only) run one agent
    test_w = HARD_W[1:]
    flops = np.where(test_w > 0, [FLOPS["alpha"], FLOPS["beta"]], 0).sum(1).mean()
    assert float(rows[("NIRTRouter", "gflops")]["mean"]) == pytest.approx(flops / 1e9)
    assert float(rows[("NIRTRouter", "agents_run")]["mean"]) == pytest.approx(8 / 5)
    # the quality column is the main table's accuracy
    main = _rows(tmp_path / "out" / "t.csv", "main")
    assert rows[("UniformAvg", "accuracy")]["mean"] == main[("UniformAvg", "accuracy")]["mean"]
    md = to_markdown(next(t for t in result.tables if t.key == "compute"))
    assert "| Method | Agents run | Tokens / question | GFLOPs / question | ACC ↑ |" in md
    assert "Routers (RouteLLM, NIRTRouter) run only the agents with a non-zero routing weight" in md
    assert "; RouteLLM output soft weights over every agent and pool them, so they run all agents." in md
    png = tmp_path / "out" / "t-toy-compute.png"
    assert png in result.files and png.read_bytes()[:4] == b"\x89PNG"
    assert "![ACC vs LLM compute per question](t-toy-compute.png)" in (tmp_path / "out" / "t.md").read_text()


def test_soft_target_scenario_plots_brier(tmp_path):
    target = np.array([[0.5, 0.5], [0.7, 0.3], [0.6, 0.4], [0.2, 0.8], [0.35, 0.65], [0.9, 0.1]])
    runs = make_runs(tmp_path, {"compute": COMPUTE}, target=target)
    result = run(EvalConfig(report=tmp_path / "t.md", runs=runs, plots=True))
    rows = _rows(tmp_path / "t.csv", "compute")
    p = PROBS.mean(1)[1:]
    brier = np.mean(1 + (p**2).sum(1) - 2 * (p * target[1:]).sum(1))  # expected Brier under the soft target
    assert float(rows[("UniformAvg", "brier")]["mean"]) == pytest.approx(brier, rel=1e-5)
    assert any(f.name == "t-toy-compute.png" for f in result.files)


def test_compute_not_recorded(tmp_path):
    runs = make_runs(tmp_path, None)
    result = run(EvalConfig(report=tmp_path / "t.md", runs=runs, plots=True))
    assert not any(t.key == "compute" for t in result.tables)
    assert not any("compute" in f.name for f in result.files)
    assert "compute not recorded" in (tmp_path / "t.md").read_text()


def test_compute_by_model_and_malformed():
    # one entry per model serves every agent slot of that model (homogeneous scenarios)
    tokens, flops = agent_costs({"meta": {"compute": {"agents": COMPUTE["agents"][:1]}}}, ["alpha"] * 3, "s")
    assert tokens.tolist() == [120.0] * 3 and flops.tolist() == [FLOPS["alpha"]] * 3
    bad = {"meta": {"compute": {"agents": [{"model": "alpha", "tokens_per_question": "many"}]}}}
    assert "x/scenario.json: meta.compute.agents[0]" in agent_costs(bad, ["alpha"], "x/scenario.json")
    missing = agent_costs({"meta": {"compute": COMPUTE}}, ["alpha", "gamma"], "s")
    assert "not recorded for agent model(s) gamma" in missing
