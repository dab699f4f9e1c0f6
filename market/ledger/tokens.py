"""The tokens a server has recently looked up, so that the API's hot path skips the database read: the ones
found valid, and the ones refused (unknown or revoked).

    gen = cache.generation()            # before the database read
    cache.put(key, principal, gen)      # after it: dropped if that agent's token changed in between
    cache.put_refused(key, gen)         # or: the token failed the lookup (dropped if it became valid since)
    cache.invalidate(agent_id)          # after a revoke or rotation of that agent committed
    cache.allow(key)                    # after a token was made valid (add, rotate, the operator's token)

A revoke or rotation by this process is effective for every request that starts after it answered: the
agent's entries are dropped after the change commits, and a lookup that read its old row before (its
generation is older) cannot put it back. Only that agent's tokens are forgotten: every other token stays
cached, so one revocation sends no other client back to the database (issue 45: after a revoke, the
operator's uncached token met the unknown-token limit of its address). Another process's change is seen
within AUTH_TTL_S, for valid and refused tokens alike. A report compares the token with the agent's locked row at once
(ledger/reports.py agent_lock; tested: tests/market/test_concurrency.py).
"""

from __future__ import annotations

import threading
import time

from walla.market.ledger.common import AUTH_TTL_S, Principal

MAX_ENTRIES = 10_000  # random tokens must not grow memory: past this a cache starts over


class TokenCache:
    """token hash -> (principal, expiry), token hash -> expiry of a refusal, and a generation that every
    change advances (per agent id or token hash: what changed since a lookup began)."""

    def __init__(self, ttl_s: float = AUTH_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._entries: dict[str, tuple[Principal, float]] = {}
        self._refused: dict[str, float] = {}
        self._generation = 0
        self._changed: dict[object, int] = {}  # agent id or token hash -> the generation of its last change
        self._floor = 0  # a lookup that began before this generation caches nothing (after a full reset)
        self._lock = threading.Lock()

    def generation(self) -> int:
        return self._generation

    def get(self, key: str) -> Principal | None:
        hit = self._entries.get(key)
        return hit[0] if hit is not None and hit[1] > time.monotonic() else None

    def refused(self, key: str) -> bool:
        """Whether `key` failed a lookup less than ttl_s ago (and was not made valid since)."""
        until = self._refused.get(key)
        return until is not None and until > time.monotonic()

    def _stale(self, what: object, generation: int) -> bool:
        return generation < self._floor or self._changed.get(what, -1) > generation

    def put(self, key: str, who: Principal, generation: int) -> None:
        """Remember `who` for `key`, unless its agent's token changed since `generation` was read."""
        with self._lock:
            if self._stale(who.id, generation):
                return
            if len(self._entries) >= MAX_ENTRIES:
                self._entries.clear()
            self._entries[key] = (who, time.monotonic() + self.ttl_s)

    def put_refused(self, key: str, generation: int) -> None:
        """Remember that `key` failed its lookup, unless it was made valid since `generation` was read."""
        with self._lock:
            if self._stale(key, generation):
                return
            if len(self._refused) >= MAX_ENTRIES:
                self._refused.clear()
            self._refused[key] = time.monotonic() + self.ttl_s

    def _advance(self, what: object) -> None:
        self._generation += 1
        if len(self._changed) >= MAX_ENTRIES:  # forget the changes, refuse every lookup begun before now
            self._changed.clear()
            self._floor = self._generation
        self._changed[what] = self._generation

    def invalidate(self, agent_id: int | None = None) -> None:
        """Forget `agent_id`'s tokens (None: every token) and refuse the puts of lookups begun before."""
        with self._lock:
            if agent_id is None:
                self._generation += 1
                self._floor = self._generation
                self._entries.clear()
                self._refused.clear()
                return
            self._advance(agent_id)
            self._entries = {k: v for k, v in self._entries.items() if v[0].id != agent_id}

    def allow(self, key: str) -> None:
        """`key` is a valid token now: forget its refusal, and refuse the refusals of lookups begun before."""
        with self._lock:
            self._advance(key)
            self._refused.pop(key, None)
