"""`walla market agent` survives a bad round (issue 29): a round it cannot handle -- a question its features
fail on, a report the market refuses, a market answering 5xx for a while -- is logged and skipped, and the
agent goes on reporting on the other rounds. Before, any non-409 error ended the agent."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
from walla.market.agent import Agent
from walla.market.client import MarketError


def _features(rnd: dict):
    if "unreadable" in rnd["question"]:
        raise ValueError("cannot score this question")
    k = len(rnd["options"])
    return [1.0 / k] * k, np.zeros(4, dtype=np.float32)


class FlakyRounds:
    """A client whose first listing of rounds answers 503 (the market restarting)."""

    def __init__(self, client) -> None:
        self.client, self.failed = client, False

    def __getattr__(self, name):
        return getattr(self.client, name)

    def rounds(self, *args, **kwargs):
        if not self.failed:
            self.failed = True
            raise MarketError(503, "service unavailable")
        return self.client.rounds(*args, **kwargs)


def test_agent_logs_and_skips_bad_rounds(market, caplog):
    alice = market.agent("alice")
    good = market.op.open_round("fine?", ["a", "b"])["id"]
    bad_q = market.op.open_round("unreadable?", ["a", "b"])["id"]
    capped = market.op.open_round("capped?", ["a", "b"], max_wager=0.01)["id"]
    later = market.op.open_round("later?", ["a", "b", "c"])["id"]
    head = SimpleNamespace(wager=lambda hidden: 0.5)
    agent = Agent(FlakyRounds(alice), head, _features)
    polls = iter(range(3))
    with caplog.at_level(logging.WARNING, logger="walla.market.agent"):
        agent.run(poll=0.01, stop=lambda: next(polls, None) is None)
    assert agent.reported == {good, later}
    assert agent.skipped == {bad_q, capped}
    text = caplog.text
    assert "retrying" in text and f"round {bad_q} skipped: ValueError" in text
    assert f"round {capped} skipped: HTTP 409: wager:" in text
    assert text.count(f"round {bad_q} skipped") == 1  # logged once, not at every poll
