"""A market server on a free loopback port in a background thread (replay, the load test, the tests).

with LocalServer(ledger) as srv:
    MarketClient(srv.url, token).rounds()
"""

from __future__ import annotations

import socket
import threading

import uvicorn
from walla.market.api import MAX_BODY, create_app, guarded_config
from walla.market.client import wait_ready
from walla.market.ledger import Ledger


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class LocalServer:
    """uvicorn serving create_app(ledger, max_body, **app_kwargs) on 127.0.0.1:<free port> until stop()."""

    def __init__(
        self, ledger: Ledger, max_body: int = MAX_BODY, host: str = "127.0.0.1", **app_kwargs
    ) -> None:
        self.port = free_port(host)
        self.url = f"http://{host}:{self.port}"
        config = guarded_config(  # the connection limits of `walla market serve` (api/guard.py)
            create_app(ledger, max_body, **app_kwargs),
            host=host,
            port=self.port,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=2,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="walla-market-server", daemon=True)

    def start(self) -> LocalServer:
        self.thread.start()
        wait_ready(self.url)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
