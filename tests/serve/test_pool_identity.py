"""A served answer is never silently stale or foreign (issue 48, items 3-5): the server notices a changed or
removed run and refuses with one line, every answer names the heads it used, the pool's id carries its
identity so two pools of one run key on one ledger never touch each other, and storage faults answer 503
with one line while /v1/models answers from memory; a database fault in the middle of a forecast leaves no
round (the round is one transaction), and the audit names any served round an older server left open."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import sqlite3

import httpx
import pytest
import torch
from serve_fixtures import start_serving
from sqlalchemy.exc import OperationalError
from walla.market.audit import audit
from walla.market.ledger import Ledger
from walla.serve.forecast import Forecaster
from walla.serve.loading import ServeConfig, load_pool

QUESTION = {"question": "Box 3 holds pens. Does box 3 hold cups?", "options": ["Yes", "No"]}


def run_copy(pool, tmp_path):
    """`pool` serving a copy of its run directory (a test may rewrite or remove it)."""
    from walla.serve.loading import WATCHED, run_file  # issue 48's: here so the other tests run without them

    run = tmp_path / "run"
    shutil.copytree(pool.run_dir, run)
    return dataclasses.replace(pool, run_dir=run, files={n: run_file(run / n) for n in WATCHED})


@pytest.fixture
def copied(served_pool, tmp_path):
    srv, s = start_serving(run_copy(served_pool, tmp_path), tmp_path)
    yield s
    srv.__exit__()
    s.fc.stop()
    s.ledger.close()


def forecast(s) -> httpx.Response:
    return httpx.post(s.url + "/v1/forecast", json=QUESTION, headers=s.auth)


def test_every_answer_names_the_digest_of_the_heads_it_used(serving):
    digest = hashlib.sha256((serving.fc.pool.run_dir / "state.pt").read_bytes()).hexdigest()[:16]
    assert forecast(serving).json()["head_digest"] == digest
    card = httpx.get(serving.url + "/v1/models", headers=serving.auth).json()["data"][0]
    assert card["walla"]["head_digest"] == digest


def test_a_retrained_run_is_refused_not_served_stale(copied):
    state = copied.fc.pool.run_dir / "state.pt"
    created = httpx.get(copied.url + "/v1/models", headers=copied.auth).json()["data"][0]["created"]
    assert forecast(copied).status_code == 200
    state.touch()  # the same bytes, a new mtime: still the run served
    assert forecast(copied).status_code == 200
    saved = torch.load(state, weights_only=False)
    saved["retrained"] = True  # walla train rewrote the run key's heads
    torch.save(saved, state)
    r = forecast(copied)
    assert r.status_code == 503 and "\n" not in r.text, r.text
    assert r.json()["error"].startswith("run: state.pt of the served run") and "changed on disk" in r.text
    card = httpx.get(copied.url + "/v1/models", headers=copied.auth)
    assert card.status_code == 200 and card.json()["data"][0]["created"] == created  # not "fresh"


def test_a_removed_run_directory_answers_503_and_models_from_memory(copied):
    shutil.rmtree(copied.fc.pool.run_dir)
    r = forecast(copied)
    assert r.status_code == 503 and r.json()["error"].startswith("run: ") and "\n" not in r.text, r.text
    assert httpx.get(copied.url + "/v1/models", headers=copied.auth).status_code == 200


def test_two_pools_of_one_run_key_on_one_ledger_never_touch_each_other(tiny_pool, served_pool, tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(tiny_pool["runs"], runs)
    (state,) = [p for p in runs.rglob("state.pt") if p.parent.name == f"seed={served_pool.seed}"]
    saved = torch.load(state, weights_only=False)
    saved["retrained"] = True  # other heads under the same run key (as another dtype's features give)
    torch.save(saved, state)
    other = load_pool(ServeConfig(scenario=tiny_pool["scenario"], runs=runs, store=tiny_pool["store"]))
    try:
        assert other.choice.key_id == served_pool.choice.key_id  # the same run key ...
        assert other.model_id != served_pool.model_id  # ... another pool
        assert other.model_id.startswith(f"walla:{served_pool.choice.scenario}/walla-i/seed18@")
        assert {a.name for a in other.agents}.isdisjoint(a.name for a in served_pool.agents)
        ledger = Ledger.open(str(tmp_path / "serve.db"))
        first = Forecaster(served_pool, ledger).start()
        half = ledger.open_round(
            "Q?", ["Yes", "No"], served_pool.settings, source=f"walla serve {served_pool.model_id}; caller x"
        )
        tokens = [ledger.rotate(a.name) for a in served_pool.agents]
        second = Forecaster(other, ledger).start()  # starting the other pool ...
        assert (
            second.voided == [] and ledger.get_round(half["id"])["status"] == "open"
        )  # ... leaves its round
        assert all(ledger.authenticate(t) is not None for t in tokens)  # ... and its agents' tokens
        first.stop()
        second.stop()
        ledger.close()
    finally:
        other.close()


def readonly(*_a, **_k):
    raise OperationalError("INSERT ...", {}, sqlite3.OperationalError("attempt to write a readonly database"))


def test_a_ledger_that_cannot_be_written_answers_503_in_one_line(serving, monkeypatch):
    monkeypatch.setattr(serving.ledger, "record_closed_round", readonly)
    r = forecast(serving)
    assert r.status_code == 503 and "\n" not in r.text, r.text
    assert r.json()["error"] == "ledger: unavailable (attempt to write a readonly database); retry later"
    assert r.headers["Retry-After"] == "1"
    body = {"model": serving.fc.pool.model_id, "messages": [{"role": "user", "content": "Q?\nA. Yes\nB. No"}]}
    r = httpx.post(serving.url + "/v1/chat/completions", json=body, headers=serving.auth)
    assert r.status_code == 503 and r.json()["error"]["type"] == "server_error", r.text
    assert httpx.get(serving.url + "/v1/models", headers=serving.auth).status_code == 200


def test_a_database_fault_mid_round_leaves_no_round(serving, monkeypatch):
    from walla.market.ledger import reports

    write, calls = reports.write_report, []

    def fails_second(*a, **k):  # the first report written, every later one refused (retries too)
        calls.append(1)
        if len(calls) >= 2:
            readonly()
        return write(*a, **k)

    before = serving.ledger.counts()["rounds"]
    monkeypatch.setattr(reports, "write_report", fails_second)
    r = forecast(serving)
    assert r.status_code == 503 and "\n" not in r.text, r.text
    assert serving.ledger.counts()["rounds"] == before  # one transaction: the round whole or absent
    problem, summary = audit(serving.ledger)
    assert problem is None and summary["open_served"] == []
    monkeypatch.setattr(reports, "write_report", write)  # the database is back
    assert forecast(serving).status_code == 200
    assert serving.ledger.counts()["rounds"] == before + 1
