"""Serve fixtures: one tiny trained pool per session (models loaded once), a fresh ledger and server per test.

def test_x(serving):              # the pool behind a live server, a caller's and the operator's token
    httpx.post(serving.url + "/v1/forecast", json={...}, headers=serving.auth)
"""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi", reason="walla serve needs the market extra: pip install 'walla[market]'")

from serve_fixtures import start_serving, train_tiny_pool  # noqa: E402
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


@pytest.fixture(scope="session")
def tolerance_pool(tmp_path_factory):
    """The same tiny pool extracted in float32: hf's tier `tolerance` on a CPU (a recorded bound)."""
    tiny = train_tiny_pool(tmp_path_factory.mktemp("serve-fp32"), dtype="float32")
    pool = load_pool(ServeConfig(scenario=tiny["scenario"], runs=tiny["runs"], store=tiny["store"]))
    yield pool
    pool.close()


@pytest.fixture
def serving(served_pool, tmp_path):
    srv, s = start_serving(served_pool, tmp_path)
    yield s
    srv.__exit__()
    s.fc.stop()
    s.ledger.close()
