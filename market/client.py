"""A small synchronous client of the market's HTTP API (agents, replay, the load test).

c = MarketClient("http://127.0.0.1:8765", token)
rid = c.open_round("Is it red?", ["yes", "no"])["id"]     # operator token
c.submit(rid, [0.7, 0.3], 0.2)                           # agent token
"""

from __future__ import annotations

import time
from typing import Any

import httpx


class MarketError(RuntimeError):
    """A non-2xx answer: the status and the server's one-line error."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.message = status, message


class MarketClient:
    def __init__(self, url: str, token: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.http = httpx.Client(
            base_url=self.url, timeout=timeout, headers={"Authorization": f"Bearer {token}"}
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> MarketClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def request(self, method: str, path: str, **kwargs) -> Any:
        r = self.http.request(method, path, **kwargs)
        if r.status_code >= 400:
            try:
                message = r.json().get("error", r.text)
            except ValueError:
                message = r.text
            raise MarketError(r.status_code, message)
        return r.json()

    # operator
    def open_round(self, question: str, options: list[str], **settings) -> dict:
        return self.request("POST", "/rounds", json={"question": question, "options": options, **settings})

    def close_round(self, rid: int) -> dict:
        return self.request("POST", f"/rounds/{rid}/close")

    def resolve(self, rid: int, label: int | None = None, target: list[float] | None = None) -> dict:
        body = {"label": label} if target is None else {"target": list(target)}
        return self.request("POST", f"/rounds/{rid}/resolve", json=body)

    def add_agent(self, name: str) -> str:
        return self.request("POST", "/agents", json={"name": name})["token"]

    def agents(self) -> list[dict]:
        return self.request("GET", "/agents")

    def reports(self, rid: int) -> list[dict]:
        return self.request("GET", f"/rounds/{rid}/reports")

    def market(self) -> dict:
        return self.request("GET", "/market")

    # everyone
    def rounds(self, status: str | None = None, after: int = 0, limit: int = 100) -> list[dict]:
        params = {"after": after, "limit": limit, **({"status": status} if status else {})}
        return self.request("GET", "/rounds", params=params)

    def round(self, rid: int) -> dict:
        return self.request("GET", f"/rounds/{rid}")

    def pool(self, rid: int) -> dict:
        return self.request("GET", f"/rounds/{rid}/pool")

    # agent
    def submit(self, rid: int, probabilities: list[float], wager: float) -> dict:
        return self.request(
            "PUT", f"/rounds/{rid}/report", json={"probabilities": list(probabilities), "wager": float(wager)}
        )

    def my_report(self, rid: int) -> dict:
        return self.request("GET", f"/rounds/{rid}/report")

    def me(self) -> dict:
        return self.request("GET", "/me")

    def my_payouts(self, after: int = 0) -> list[dict]:
        return self.request("GET", "/me/payouts", params={"after": after})


def wait_ready(url: str, timeout: float = 30.0) -> None:
    """Block until the server at `url` answers GET / (or raise TimeoutError)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url.rstrip("/") + "/", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"market server at {url} did not answer within {timeout:.0f} s")
        time.sleep(0.05)
