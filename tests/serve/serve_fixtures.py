"""Helpers of the serve tests: a tiny trained pool in bfloat16 (tier `bitwise`), an app on a loopback port.

    market = train_tiny_pool(tmp)        # {"model", "store", "runs", "scenario"}: walla-i, seed 18, heads saved
    with AppServer(create_serve_app(fc, open_access=True)) as srv: httpx.get(srv.url + "/v1/models")

The tiny LLM and the training settings are the market tests' (tests/market/trained_market.py); the only
change is bfloat16 extraction, whose scoring on a CPU is batch-invariant, as the demo's models are.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "market"))

import trained_market  # noqa: E402
from walla.market.head import AgentHead  # noqa: E402
from walla.market.ledger import CALLER, Ledger  # noqa: E402
from walla.market.local import free_port  # noqa: E402
from walla.serve.app import create_serve_app  # noqa: E402
from walla.serve.forecast import Forecaster  # noqa: E402

OP_TOKEN = "operator-token-for-serve-tests-0123456789"


def train_tiny_pool(tmp: Path, dtype: str = "bfloat16") -> dict:
    """The market tests' tiny trained scenario, extracted in bfloat16 (tier `bitwise`; float32: `tolerance`),
    WALLA I only."""
    return trained_market.train_tiny_market(tmp, dtype=dtype, methods="walla-i")


def wait_answering(url: str, timeout: float = 120.0, proc=None) -> None:
    """Until GET /v1/models answers (any status: the server is up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            httpx.get(url + "/v1/models", timeout=2.0)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f} s")


class AppServer:
    """uvicorn serving `app` on 127.0.0.1:<free port> in a thread."""

    def __init__(self, app) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> AppServer:
        self.thread.start()
        wait_answering(self.url, 30)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


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
    token = ledger.add_agent("alice", role=CALLER)
    fc = Forecaster(pool, ledger, learn, **batching).start()
    srv = AppServer(create_serve_app(fc, open_access)).__enter__()
    return srv, Serving(srv.url, fc, ledger, db, token)
