"""Dynamic batching: concurrent requests for one model coalesce into one scoring pass (serve/features.py).

    b = Batcher(backend, max_wait=0.01, max_tokens=8192, max_rows=64, max_queue=256).start()
    fut = b.submit([(prompt, ["A", "B"]), ...])     # concurrent.futures.Future -> [(probs, hidden, tokens)]

One worker thread per loaded model takes the oldest waiting job, then every job that arrives within
`max_wait` seconds, while the batch holds at most `max_rows` prompts and about `max_tokens` prompt tokens
(estimated as characters / 4, as walla-extract estimates a job), and scores them in one `backend.score`
call. A job whose caller went away (its future cancelled) is dropped before the pass, and holds no place in
the queue from then on. A pass that fails is retried job by job, so one bad prompt fails only its own
request. The queue is bounded: `submit` raises QueueFull when `max_queue` live jobs wait (the API answers 429
with Retry-After).

Batch invariance: with a `bitwise` backend a prompt's numbers do not depend on which prompts share its
pass, so an answer does not depend on which requests it was batched with (tests/serve/test_serve_batching.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from walla.extract.backends import Backend
from walla.serve.features import Item, score_prompts

log = logging.getLogger("walla.serve")

MAX_WAIT_S = 0.01  # how long a pass waits for more requests after the first
MAX_ROWS = 64
MAX_TOKENS = 16_384
MAX_QUEUE = 256  # waiting jobs per model: beyond it, 429


class QueueFull(RuntimeError):
    """More than `max_queue` jobs wait for this model."""


@dataclass
class Job:
    items: Sequence[Item]
    future: Future = field(default_factory=Future)
    queued_at: float = field(default_factory=time.perf_counter)

    @property
    def tokens(self) -> int:
        return sum(len(p) // 4 + 1 for p, _ in self.items)


@dataclass
class BatchStats:
    passes: int = 0
    prompts: int = 0
    tokens: int = 0  # prompt tokens scored
    largest: int = 0


class Batcher:
    """The batching worker of one model (module docstring)."""

    def __init__(
        self,
        backend: Backend,
        name: str = "model",
        max_wait: float = MAX_WAIT_S,
        max_tokens: int = MAX_TOKENS,
        max_rows: int = MAX_ROWS,
        max_queue: int = MAX_QUEUE,
    ) -> None:
        self.backend, self.name = backend, name
        self.max_wait, self.max_tokens, self.max_rows = max_wait, max_tokens, max_rows
        self.max_queue = max_queue
        self.jobs: deque[Job] = deque()  # waiting, oldest first; a cancelled one holds no place
        self.ready = threading.Condition()
        self.stopping = False
        self.stats = BatchStats()
        self.thread = threading.Thread(target=self._run, name=f"walla-serve-{name}", daemon=True)
        self._held: Job | None = None  # a job taken that did not fit the last batch

    def start(self) -> Batcher:
        self.thread.start()
        return self

    def stop(self) -> None:
        with self.ready:
            self.stopping = True
            self.ready.notify_all()
        self.thread.join(timeout=30)
        with self.ready:
            for j in self.jobs:  # never scored: their callers hear so instead of waiting
                j.future.cancel()
            self.jobs.clear()

    def waiting(self) -> int:
        """Jobs waiting whose callers still wait (a cancelled job is dropped here: its place is free)."""
        with self.ready:
            self._drop_cancelled()
            return len(self.jobs)

    def _drop_cancelled(self) -> None:
        if any(j.future.cancelled() for j in self.jobs):
            self.jobs = deque(j for j in self.jobs if not j.future.cancelled())

    def submit(self, items: Sequence[Item]) -> Future:
        job = Job(list(items))
        with self.ready:
            if len(self.jobs) >= self.max_queue:
                self._drop_cancelled()  # callers that went away free their places
            if len(self.jobs) >= self.max_queue:
                raise QueueFull(f"{self.name}: {self.max_queue} requests are waiting")
            self.jobs.append(job)
            self.ready.notify()
        return job.future

    def _next(self, timeout: float | None) -> Job | None:
        """The oldest waiting job within `timeout` seconds (None: wait as long as it takes); None when there is
        none by then or the batcher stops."""
        deadline = None if timeout is None else time.perf_counter() + timeout
        with self.ready:
            while not self.jobs and not self.stopping:
                left = None if deadline is None else deadline - time.perf_counter()
                if left is not None and left <= 0:
                    return None
                self.ready.wait(left)
            return self.jobs.popleft() if self.jobs and not self.stopping else None

    def _take(self) -> list[Job] | None:
        first = self._held or self._next(None)
        self._held = None
        if first is None:
            return None
        batch, rows, tokens = [first], len(first.items), first.tokens
        deadline = time.perf_counter() + self.max_wait
        while rows < self.max_rows:
            job = self._next(max(0.0, deadline - time.perf_counter()))
            if job is None:
                break
            if rows + len(job.items) > self.max_rows or tokens + job.tokens > self.max_tokens:
                self._held = job
                break
            batch.append(job)
            rows, tokens = rows + len(job.items), tokens + job.tokens
        return batch

    def _run(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            live = [j for j in batch if j.future.set_running_or_notify_cancel()]  # callers still waiting
            if live:
                self._score(live)

    def _features(self, items: Sequence[Item]) -> list:
        """One pass: in this process, or on the model's Ray worker (serve/remote.py RemoteBackend)."""
        remote = getattr(self.backend, "features", None)
        return remote(items) if remote is not None else score_prompts(self.backend, items)

    def _score(self, jobs: list[Job]) -> None:
        items = [it for j in jobs for it in j.items]
        try:
            out = self._features(items)
        except Exception as e:  # noqa: BLE001 - one bad prompt must not fail the others: retry alone
            if len(jobs) == 1:
                jobs[0].future.set_exception(e)
                return
            for j in jobs:
                try:
                    j.future.set_result(self._features(j.items))
                except Exception as e1:  # noqa: BLE001 - handed to that request's caller
                    j.future.set_exception(e1)
            log.warning("%s: a batched pass failed (%s); scored its requests one by one", self.name, e)
            return
        self.stats.passes += 1
        self.stats.prompts += len(items)
        self.stats.tokens += sum(o[2] for o in out)
        self.stats.largest = max(self.stats.largest, len(items))
        at = 0
        for j in jobs:
            j.future.set_result(out[at : at + len(j.items)])
            at += len(j.items)
