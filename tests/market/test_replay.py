"""Replay and the live agent on a tiny trained market (conftest `trained`: trained_market.py).

Frozen heads reproduce walla train's wagers, pooled forecasts and payouts through the HTTP API; the agent's
features are walla extract's; a head update is one step of the run's loss and optimizer.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from market_fixtures import OP_TOKEN
from walla.market.agent import Agent, LLMFeatures
from walla.market.cli import run_market
from walla.market.client import MarketClient
from walla.market.head import AgentHead
from walla.market.ledger import Ledger
from walla.market.local import LocalServer
from walla.market.replay import ReplayConfig, _compare, replay
from walla.store.schema import VARIANTS
from walla.train.runs import (
    RUN_META,
    TRAIN_SCHEMA,
    RunFormatError,
    choose_runs,
    read_scenario_table,
    scenario_data,
)


@pytest.fixture(scope="module")
def replayed(trained, tmp_path_factory) -> tuple:
    """walla-i replayed once with frozen heads into a ledger file: (ReplayResult, the ledger's path)."""
    db = str(tmp_path_factory.mktemp("replayed") / "replayed.db")
    cfg = ReplayConfig(trained["scenario"], trained["runs"], trained["store"], "walla-i", seeds=[18], db=db)
    return replay(cfg, out=lambda s: None), db


def test_replay_equals_offline(trained, replayed):
    walla_ii = ReplayConfig(trained["scenario"], trained["runs"], trained["store"], "walla-ii", seeds=[18])
    for result in (replayed[0], replay(walla_ii, out=lambda s: None)):
        (seed,) = result.seeds
        assert seed.n_rounds >= 15
        assert max(result.max_diff.values()) < 1e-6, result.max_diff
        for k, v in seed.live.items():
            assert v == pytest.approx(seed.offline[k], abs=1e-6), k
        assert seed.deficit <= seed.deficit_bound


def test_replay_learning_changes_heads(trained):
    cfg = ReplayConfig(
        trained["scenario"], trained["runs"], trained["store"], "walla-i", seeds=[18], learn=True
    )
    (seed,) = replay(cfg, out=lambda s: None).seeds
    assert seed.updates == 3 * seed.n_rounds  # one step per agent per resolved round
    assert seed.max_diff["wagers"] > 1e-6  # the heads moved: later wagers differ from the frozen run's


def test_a_live_head_comes_only_from_a_current_run(trained, tmp_path):
    """The base-key rule of joining holds for live agents too (issue 28): a stale run (another walla train
    schema, other inputs) or one moved out of its key directory gives no head, as walla eval counts none."""
    runs = tmp_path / "runs"
    shutil.copytree(trained["runs"], runs)
    run = choose_runs(runs, trained["scenario"]).seeds[18].path
    AgentHead.from_run(run, slot=0)  # current: taken
    meta = json.loads((run / RUN_META).read_text())
    for field, value, why in (
        ("schema", TRAIN_SCHEMA - 1, f"trained by walla train schema {TRAIN_SCHEMA - 1}"),
        ("scenario_inputs_id", "0" * 16, "trained from other inputs"),
    ):
        (run / RUN_META).write_text(json.dumps({**meta, "run_key": {**meta["run_key"], field: value}}))
        with pytest.raises(RunFormatError, match=f"{run}: stale run: {why}"):
            AgentHead.from_run(run, slot=0)
    (run / RUN_META).write_text(json.dumps(meta))
    moved = run.parent.parent / "0123456789" / run.name
    shutil.move(run.parent, moved.parent)
    with pytest.raises(RunFormatError, match="not the one of directory walla-i/0123456789"):
        AgentHead.from_run(moved, slot=0)


def test_head_update_is_the_runs_step(trained):
    """AgentHead.update = one step of walla's per-agent loss with the run's lr, clip and Adam, from the agent's
    own advantages (checked against a plain torch computation on the same head, dropout masks included)."""
    run = choose_runs(trained["runs"], trained["scenario"]).seeds[18].path
    head = AgentHead.from_run(run, slot=1)
    ref = head.heads.head(0)  # the same function as a plain WagerHead
    cfg = head.cfg
    rng = np.random.default_rng(0)
    hidden = [rng.standard_normal(head.in_dim).astype(np.float16) for _ in range(5)]
    adv = [0.3, -0.2, 0.05, 0.9, 0.0]
    state = np.random.default_rng([18, 3, 1])  # AgentHead's mask generator for seed 18, slot 1
    masks = [
        torch.from_numpy(state.random((1, 5, w), dtype=np.float32) < 1 - cfg.dropout)[0] for w in cfg.hidden
    ]
    x = head._input(hidden)[0]
    opt = torch.optim.Adam(ref.parameters(), lr=cfg.lr)
    w = torch.sigmoid(ref(x, masks).double() / cfg.temperature)
    target = torch.tensor(adv, dtype=torch.float64).div(2 * cfg.c3).clamp(0, 1)
    loss = ((w - target) ** 2).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(ref.parameters(), cfg.clip)
    opt.step()
    got = head.update(list(zip(hidden, adv, strict=True)))
    assert got == pytest.approx(float(loss.detach()), rel=1e-6)
    after = head.heads.head(0)
    for a, b in zip(after.parameters(), ref.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5)
    assert any(
        not torch.equal(a, b)
        for a, b in zip(
            after.parameters(), AgentHead.from_run(run, 1).heads.head(0).parameters(), strict=True
        )
    )


def test_live_agent_with_llm(trained, tmp_path):
    """The agent scores a round's question with the hf backend exactly as walla extract did (same probabilities),
    reports its head's wager on those features, and learns from its payout after the resolution."""
    table = read_scenario_table(trained["runs"], trained["scenario"])
    data = scenario_data(table, trained["store"])
    slot = 0
    rows = [r for r in range(len(data.split)) if VARIANTS[data.variant[r, slot]] == "none"][:2]
    run = choose_runs(trained["runs"], trained["scenario"]).seeds[18].path
    ledger = Ledger.open(str(tmp_path / "m.db"))
    ledger.ensure_operator(OP_TOKEN)
    with LocalServer(ledger) as srv, MarketClient(srv.url, OP_TOKEN) as op:
        client = MarketClient(srv.url, op.add_agent("tiny"))
        features = LLMFeatures(str(trained["model"]), "facts", dtype="float32")
        agent = Agent(client, AgentHead.from_run(run, slot), features, learn=True)
        rids = [op.open_round(data.question[r], ["Yes", "No"])["id"] for r in rows]
        assert agent.report_open_rounds() == 2
        for rid, r in zip(rids, rows, strict=True):
            mine = client.my_report(rid)
            assert np.allclose(mine["probabilities"], data.probs[r, slot], atol=1e-4)
            want = AgentHead.from_run(run, slot).wager(data.hidden[slot][r])
            assert mine["wager"] == pytest.approx(want, abs=1e-3)  # features: float32 live vs float16 stored
            op.resolve(rid, label=int(data.label[r]))
        assert len(agent.collect_payouts()) == 2 and agent.head.steps == 2
        client.close()
    ledger.close()


def test_agent_plays_a_head_only_on_features_of_its_identity(trained, tmp_path, capfd, caplog):
    """Issue 47, item 1: `walla market agent` settles its LLM through extraction's door to the identity the
    head's features recorded (as walla serve does). Played with features of another identity (another dtype
    here) it stops with one line naming the field; with --other-identity it plays, every report labelled."""
    run = choose_runs(trained["runs"], trained["scenario"]).seeds[18].path
    ledger = Ledger.open(str(tmp_path / "m.db"))
    ledger.ensure_operator(OP_TOKEN)
    with LocalServer(ledger) as srv, MarketClient(srv.url, OP_TOKEN) as op:
        args = ["agent", "--url", srv.url, "--token", op.add_agent("tiny"), "--model", str(trained["model"])]
        args += ["--dataset", "facts", "--head", str(run), "--slot", "0", "--store", str(trained["store"])]
        args += ["--frozen", "--poll", "0.05", "--max-rounds", "0"]
        assert run_market([*args, "--dtype", "bfloat16"]) == 1
        err = capfd.readouterr().err.strip()
        # bfloat16 is the bitwise tier, which records the CPU and kernel path float32 does not: the first field
        assert len(err.splitlines()) == 1 and "another identity than the feature set recorded: " in err, err
        assert "accelerator: None != " in err
        assert "--other-identity" in err
        assert run_market(args) == 0, capfd.readouterr().err  # the recorded identity: it plays, unlabelled
        assert "another identity" not in capfd.readouterr().err
        rid = op.open_round("Is the door of room 42 painted red?", ["Yes", "No"])["id"]
        resolver = threading.Thread(target=_resolve_once_reported, args=(op, rid))
        resolver.start()
        with caplog.at_level(logging.WARNING, logger="walla.market.agent"):
            rc = run_market([*args[:-1], "1", "--dtype", "bfloat16", "--other-identity"])
        resolver.join()
        err = capfd.readouterr().err
        assert rc == 0, err
        assert "playing another identity than the head's features: accelerator: None != " in err
        assert f"round {rid}: reported on another identity than the head's features: accel" in caplog.text
    ledger.close()


def _resolve_once_reported(op: MarketClient, rid: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not op.reports(rid):
        time.sleep(0.05)
    op.close_round(rid)
    op.resolve(rid, label=0)


def test_replay_cli(trained, capfd):
    rc = run_market(
        [
            "replay",
            "--scenario",
            trained["scenario"],
            "--runs",
            str(trained["runs"]),
            "--store",
            str(trained["store"]),
            "--seeds",
            "18",
            "--limit",
            "6",
        ],
        "walla market",
    )
    out, err = capfd.readouterr()
    assert rc == 0, err
    assert "max |live - offline|" in out and "accuracy" in out and "market deficit" in out
    rc = run_market(
        ["replay", "--scenario", "nope", "--runs", str(trained["runs"]), "--store", str(trained["store"])],
        "walla market",
    )
    out, err = capfd.readouterr()
    assert rc == 1 and len(err.strip().splitlines()) == 1 and "scenario.json" in err, err
    rc = run_market(
        [
            "replay",
            "--scenario",
            trained["scenario"],
            "--runs",
            str(trained["runs"]),
            "--store",
            str(trained["store"]),
            "--method",
            "uniform",
        ],
        "walla market",
    )
    out, err = capfd.readouterr()
    assert rc == 1 and len(err.strip().splitlines()) == 1 and "no uniform runs" in err, err


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_dashboard_in_a_browser(replayed, tmp_path):
    """GET / in headless Chromium (the distribution's, driven by Playwright) after a replay: the page shows every
    agent with the balance the API reports, the market's totals, the four charts; a screenshot is written."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="the dashboard test needs playwright (market extra)"
    )
    exe = _chromium()
    if exe is None:
        pytest.skip("no chromium binary (make setup-market installs the distribution's package)")
    ledger = Ledger.open(replayed[1])
    ledger.ensure_operator(OP_TOKEN)
    shot = tmp_path / "dashboard.png"
    with LocalServer(ledger) as srv, MarketClient(srv.url, OP_TOKEN) as op, sync_api.sync_playwright() as p:
        api = op.market()
        browser = p.chromium.launch(executable_path=exe, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1200, "height": 1000})
        page.goto(f"{srv.url}/#token={OP_TOKEN}")
        page.wait_for_selector("body[data-loaded='1']", timeout=20_000)
        assert len(api["agents"]) == 3
        for a in api["agents"]:
            row = page.locator(f"tr[data-agent='{a['name']}']")
            assert row.locator(".balance").inner_text() == f"{a['balance']:.4f}"
            assert row.locator(".reports").inner_text() == str(a["n_reports"])
        t = api["totals"]
        assert page.inner_text("#rounds-resolved") == str(t["rounds_resolved"]) and t["rounds_resolved"] > 0
        assert page.inner_text("#deficit") == f"{t['deficit']:.4f}"
        assert page.inner_text("#deficit-bound") == f"{t['deficit_bound']:.1f}"
        assert page.inner_text("#pool-brier") == f"{t['pool_brier']:.4f}"
        assert page.inner_text("#pool-acc") == f"{100 * t['pool_acc']:.2f} %"
        assert page.locator("#chart-wagers polyline").count() == 3
        assert page.locator("#chart-payouts polyline").count() == 3
        page.screenshot(path=str(shot), full_page=True)
        # issue 29: no token left in the address bar; sign-out clears the stored token and the page
        assert OP_TOKEN not in page.url and "token" not in page.url
        assert page.evaluate("sessionStorage.getItem('walla-market-token')") == OP_TOKEN
        assert page.evaluate("localStorage.getItem('walla-market-token')") is None
        page.click("#signout")
        assert page.evaluate("sessionStorage.getItem('walla-market-token')") is None
        assert page.inner_text("#error") == "Signed out." and page.locator("tr[data-agent]").count() == 0
        page.reload()
        page.wait_for_timeout(300)
        assert page.get_attribute("body", "data-loaded") is None and "operator token" in page.inner_text(
            "#error"
        )
        browser.close()
    ledger.close()
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    print(f"dashboard screenshot: {shot}")


def test_live_metrics_see_offline_ties():
    """An exact tie in the stored (float32) offline pool that float64 live arithmetic breaks by 1e-8 is
    still a tie live: accuracy and the other metrics agree (the demo's lr=0.002 key had three such rows)."""
    n, m = 4, 2
    table = SimpleNamespace(
        probs=np.random.default_rng(0).dirichlet([1.0, 1.0], size=(n, m)),
        label=np.array([0, 1, 0, 1]),
        target=np.eye(2)[[0, 1, 0, 1]],
    )
    offline_pool = np.array([[0.5, 0.5], [0.3, 0.7], [0.5, 0.5], [0.2, 0.8]], dtype=np.float32)
    weights = np.full((n, m), 0.5)
    record = SimpleNamespace(
        agg_probs=offline_pool.astype(np.float64),
        weights=weights,
        extras={"wagers": np.zeros((n, m)), "payouts": np.zeros((n, m))},
    )
    live_pool = offline_pool.astype(np.float64) + np.array([[-1e-8, 1e-8], [0, 0], [1e-8, -1e-8], [0, 0]])
    live = {"pool": live_pool, "weights": weights, "wagers": np.zeros((n, m)), "payouts": np.zeros((n, m))}
    diff, live_metrics, offline_metrics = _compare(live, record, table, np.arange(n))
    assert diff["pool"] == pytest.approx(1e-8, rel=1e-3)
    np.testing.assert_equal(live_metrics, offline_metrics)  # NaN == NaN (AUC of a tiny table)
    assert live_metrics["accuracy"] == 1.0  # ties go to the first option (label 0), as in walla eval


def test_audit_of_a_replayed_market(replayed, capfd):
    """`walla market audit` on the ledger a replay wrote: the chain verifies, every payout recomputes (exit 0)."""
    assert run_market(["audit", "--db", replayed[1]], "walla market") == 0
    out = capfd.readouterr().out
    assert "walla market audit: OK" in out and "max |stored - recomputed| 0.00e+00" in out, out


def test_head_update_calls_the_training_step(trained, monkeypatch):
    """One implementation of the step: AgentHead.update runs walla train's wager_loss and optimizer_step."""
    from walla.market import head as head_module
    from walla.train.wagers import _step as wager_step

    calls = []
    for name in ("wager_loss", "optimizer_step"):
        real = getattr(wager_step, name)
        monkeypatch.setattr(
            head_module, name, lambda *a, _real=real, _n=name, **k: calls.append(_n) or _real(*a, **k)
        )
    run = choose_runs(trained["runs"], trained["scenario"]).seeds[18].path
    h = AgentHead.from_run(run, slot=0)
    h.update([(np.zeros(h.in_dim, dtype=np.float32), 0.2)])
    assert calls == ["wager_loss", "optimizer_step"]
