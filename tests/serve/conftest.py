"""Serve fixtures: one tiny trained pool per session (models loaded once), a fresh ledger and server per test.

def test_x(serving):              # the pool behind a live server, a caller's and the operator's token
    httpx.post(serving.url + "/v1/forecast", json={...}, headers=serving.auth)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

pytest.importorskip("fastapi", reason="walla serve needs the market extra: pip install 'walla[market]'")

from serve_fixtures import OP_TOKEN, AppServer, train_tiny_pool  # noqa: E402
from walla.market.head import AgentHead  # noqa: E402
from walla.market.ledger import Ledger  # noqa: E402
from walla.serve.app import create_serve_app  # noqa: E402
from walla.serve.forecast import Forecaster  # noqa: E402
from walla.serve.loading import ServeConfig, load_pool  # noqa: E402


@pytest.fixture(scope="session")
def tiny_pool(tmp_path_factory) -> dict:
    return train_tiny_pool(tmp_path_factory.mktemp("serve"))


@pytest.fixture(scope="session")
def served_pool(tiny_pool):
    pool = load_pool(
        ServeConfig(scenario=tiny_pool["scenario"], runs=tiny_pool["runs"], store=tiny_pool["store"])
    )
    yield pool
    pool.close()


def fresh_heads(pool):
    """The pool with heads of its own (a learning test must not move the session's)."""
    agents = [dataclasses.replace(a, head=AgentHead.from_run(pool.run_dir, a.slot)) for a in pool.agents]
    return dataclasses.replace(pool, agents=agents)


@dataclass
class Serving:
    url: str
    fc: Forecaster
    ledger: Ledger
    db: str
    caller_token: str

    @property
    def auth(self) -> dict:
        return {"Authorization": f"Bearer {self.caller_token}"}

    @property
    def op(self) -> dict:
        return {"Authorization": f"Bearer {OP_TOKEN}"}


def start_serving(pool, tmp_path, learn: bool = False, open_access: bool = False, **batching):
    db = str(tmp_path / "serve.db")
    ledger = Ledger.open(db)
    ledger.ensure_operator(OP_TOKEN)
    token = ledger.add_agent("alice")
    fc = Forecaster(pool, ledger, learn, **batching).start()
    srv = AppServer(create_serve_app(fc, open_access)).__enter__()
    return srv, Serving(srv.url, fc, ledger, db, token)


@pytest.fixture
def serving(served_pool, tmp_path):
    srv, s = start_serving(served_pool, tmp_path)
    yield s
    srv.__exit__()
    s.fc.stop()
    s.ledger.close()
