"""Promises per tier (issue 45, item 2): `walla serve --check` holds each agent's served features to what its
feature set's tier states (bitwise: the same bits; tolerance: the bound it recorded) and prints both, and
`/v1/models` and each answer say which promise holds. On a tolerance set the check used to hold the pool to
1e-6 as if every set were bitwise (the issue measured 3.7e-6 there)."""

from __future__ import annotations

import httpx
from serve_fixtures import start_serving
from walla.cli.lazy import run
from walla.cli.main import app as root
from walla.serve.check import check_served

QUESTION = {"question": "Box 3 holds pens. Does box 3 hold cups?", "options": ["Yes", "No"]}


def test_models_and_answers_say_which_promise_holds(served_pool, tolerance_pool, tmp_path):
    for pool, tier in ((served_pool, "bitwise"), (tolerance_pool, "tolerance")):
        (tmp_path / tier).mkdir()
        srv, s = start_serving(pool, tmp_path / tier)
        try:
            card = httpx.get(s.url + "/v1/models", headers=s.auth).json()["data"][0]["walla"]
            assert card["promise"]["tier"] == tier
            for a in card["agents"]:
                assert a["promise"]["tier"] == tier == a["tier"]
            bound = card["agents"][0]["promise"]["bound"]
            if tier == "bitwise":
                assert bound == 0.0 and "bit for bit" in card["agents"][0]["promise"]["features"]
            else:
                assert bound == tolerance_pool.agents[0].llm.settled.identity["tolerance"]
            out = httpx.post(s.url + "/v1/forecast", json=QUESTION, headers=s.auth).json()
            assert out["promise"] == tier
        finally:
            srv.__exit__()
            s.fc.stop()
            s.ledger.close()


def test_check_holds_each_tier_to_its_own_promise(served_pool, tolerance_pool, tmp_path):
    for pool, tier in ((served_pool, "bitwise"), (tolerance_pool, "tolerance")):
        (tmp_path / tier).mkdir()
        srv, s = start_serving(pool, tmp_path / tier)
        try:
            res = check_served(s.fc, limit=8)
        finally:
            srv.__exit__()
            s.fc.stop()
            s.ledger.close()
        assert res["problems"] == [], res
        assert {a["tier"] for a in res["agents"]} == {tier} and all(a["holds"] for a in res["agents"])
        assert res["path_pool"] <= 1e-6 and res["path_wagers"] <= 1e-6  # the heads and pool: walla train's
        if tier == "bitwise":
            assert (
                all(a["equal"] and a["bound"] == "equal" for a in res["agents"]) and res["pool_bound"] == 1e-6
            )
        else:
            assert (
                all(a["bound"].startswith("<= 2.0e-04 / ") for a in res["agents"])
                and res["pool_bound"] is None
            )


def test_the_check_line_prints_the_measure_and_the_promise(tiny_pool, capsys):
    args = ["serve", "--runs", str(tiny_pool["runs"]), "--scenario", tiny_pool["scenario"]]
    args += ["--store", str(tiny_pool["store"]), "--check", "--limit", "4"]
    assert run(root, args, "walla") == 0
    out = capsys.readouterr().out
    assert "(bitwise): features vs the store: max |d log p| 0.000e+00, hidden 0.000e+00, bit-identical" in out
    assert "(promise: equal; holds)" in out and "4 test questions: max |served - offline| pooled" in out
