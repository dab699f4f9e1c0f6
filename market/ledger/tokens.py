"""The tokens a server has recently found valid, so that the API's hot path skips the database read.

    gen = cache.generation()            # before the database read
    cache.put(key, principal, gen)      # after it: dropped if a revoke or rotation happened in between
    cache.invalidate()                  # after a revoke or rotation committed

A revoke or rotation by this process is effective for every request that starts after it answered: the
cache is emptied after the change commits, and a lookup that read the old row before (its generation is
older) cannot put it back. Another process's change is seen within AUTH_TTL_S of this process's last
database read of the token (tested: tests/market/test_concurrency.py), and by a report at once (the write
compares the token with the agent's locked row, ledger/reports.py agent_lock).
"""

from __future__ import annotations

import threading
import time

from walla.market.ledger.common import AUTH_TTL_S, Principal

MAX_ENTRIES = 10_000  # random tokens must not grow memory: past this the cache starts over


class TokenCache:
    """token hash -> (principal, expiry), with a generation that every invalidation advances."""

    def __init__(self, ttl_s: float = AUTH_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._entries: dict[str, tuple[Principal, float]] = {}
        self._generation = 0
        self._lock = threading.Lock()

    def generation(self) -> int:
        return self._generation

    def get(self, key: str) -> Principal | None:
        hit = self._entries.get(key)
        return hit[0] if hit is not None and hit[1] > time.monotonic() else None

    def put(self, key: str, who: Principal, generation: int) -> None:
        """Remember `who` for `key`, unless the cache was invalidated since `generation` was read."""
        with self._lock:
            if generation != self._generation:
                return
            if len(self._entries) >= MAX_ENTRIES:
                self._entries.clear()
            self._entries[key] = (who, time.monotonic() + self.ttl_s)

    def invalidate(self) -> None:
        """Forget every token, and refuse every put of a lookup that started before this call."""
        with self._lock:
            self._generation += 1
            self._entries.clear()
