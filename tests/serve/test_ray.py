"""Agents on Ray workers (a local Ray cluster, as tests/extract/test_distributed.py runs one): the same
answers bit for bit as in-process, and serve = offline."""

from __future__ import annotations

import numpy as np
import pytest
from walla.market.ledger import Ledger
from walla.serve.check import TOLERANCE, check_served
from walla.serve.forecast import Forecaster
from walla.serve.loading import ServeConfig, load_pool

ray = pytest.importorskip("ray", reason="Ray worker agents need the ray extra: pip install 'walla[ray]'")

QUESTION = ("Box 3 holds pens. Does box 3 hold cups?", ["Yes", "No"])


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    yield
    ray.shutdown()


def _ask(fc: Forecaster) -> dict:
    job = fc.prepare(*QUESTION)
    return fc.finish(job, fc.submit(job), "test")


@pytest.mark.heavy
def test_ray_worker_agents_answer_as_in_process(tiny_pool, served_pool, local_ray, tmp_path):
    cfg = ServeConfig(
        scenario=tiny_pool["scenario"], runs=tiny_pool["runs"], store=tiny_pool["store"], ray_address="local"
    )
    remote = load_pool(cfg)
    here = Forecaster(served_pool, Ledger.open(str(tmp_path / "a.db"))).start()
    there = Forecaster(remote, Ledger.open(str(tmp_path / "b.db"))).start()
    try:
        assert type(remote.agents[0].llm.backend).__name__ == "RemoteBackend"
        a, b = _ask(here), _ask(there)
        keep = ("probabilities", "choice")
        assert {k: a[k] for k in keep} == {k: b[k] for k in keep}
        assert [(x["probabilities"], x["wager"]) for x in a["agents"]] == [
            (x["probabilities"], x["wager"]) for x in b["agents"]
        ]
        res = check_served(there, limit=8)
        assert res["n"] == 8 and res["pool"] <= TOLERANCE, res
        assert not np.isnan(res["wagers"])
    finally:
        here.stop()
        there.stop()
        remote.close()
