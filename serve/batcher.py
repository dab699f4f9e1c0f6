"""Dynamic batching: concurrent requests for one model coalesce into scoring passes (extract/scoring.py), and no
request's length holds the others behind it.

    b = Batcher(backend, max_wait=0.01, pass_tokens=4096, long_tokens=512, deadline=60).start()
    fut = b.submit([(prompt, ["A", "B"]), ...], tokens=[41, ...])   # Future -> [(probs, hidden, tokens)]

One worker thread per loaded model. A job (one request's prompts for this model) waits in one of two lanes,
by its prompt tokens (counted by the caller with the model's tokenizer; estimated as characters / 4 when not
given, as walla-extract estimates a job):

- short (at most `long_tokens`): a pass takes the oldest short job, waits up to `max_wait` seconds for more,
  then adds the waiting short jobs shortest first while the pass holds at most `max_rows` prompts and
  `pass_tokens` prompt tokens;
- long: one long job at a time, alone, in passes of at most `piece_tokens` tokens where the backend scores a
  prompt in pieces with the same bits (chunked prefill: hf `score_steps` after a growing prefix of its own;
  the rest, e.g. vLLM or a Ray worker, in one pass);
- the lanes alternate while both wait, so a short request waits behind at most one long pass (one piece),
  however many long requests are queued or however long they are (tests/serve/test_fair_batching.py), and
  a long one is never starved by shorts.

The caller caps a request's prompt tokens (`--max-prompt-tokens`, serve/forecast.py: 413 over it), which
bounds the one long pass a short request may wait for. A job that waits more than `deadline` seconds fails
with QueueTimeout (the API answers 503 with Retry-After) instead of being scored for a caller that gave up. A
job whose caller went away (its future cancelled) is dropped before the pass, and holds no place in the queue
from then on. A pass that fails is retried job by job, so one bad prompt fails only its own request. The
queue is bounded: `submit` raises QueueFull when `max_queue` live jobs wait (429 with Retry-After).

Batch invariance: with a `bitwise` backend a prompt's numbers do not depend on which prompts share its
pass, so an answer does not depend on which requests it was batched with (tests/serve/test_serve_batching.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Generator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from walla.extract.backends import Backend
from walla.extract.scoring import Item, score_steps

log = logging.getLogger("walla.serve")

MAX_WAIT_S = 0.01  # how long a short pass waits for more requests after the first
MAX_ROWS = 64  # prompts per pass
PASS_TOKENS = 4096  # prompt tokens per short pass
LONG_TOKENS = 512  # a job of more prompt tokens is long: scored alone, in pieces
PIECE_TOKENS = 128  # tokens of each piece of a long job (where the backend scores pieces)
MAX_QUEUE = 256  # waiting jobs per model: beyond it, 429
DEADLINE_S = 60.0  # longest wait in the queue: beyond it, 503


class QueueFull(RuntimeError):
    """More than `max_queue` jobs wait for this model."""


class QueueTimeout(RuntimeError):
    """A job waited longer than the batcher's deadline; it was not scored."""


def estimate_tokens(prompt: str) -> int:
    return len(prompt) // 4 + 1


@dataclass
class Job:
    items: Sequence[Item]
    tokens: int = 0  # prompt tokens of all its items
    future: Future = field(default_factory=Future)
    queued_at: float = field(default_factory=time.perf_counter)


@dataclass
class BatchStats:
    passes: int = 0
    long_passes: int = 0
    prompts: int = 0
    tokens: int = 0  # prompt tokens scored
    largest: int = 0
    timed_out: int = 0


class Batcher:
    """The batching worker of one model (module docstring)."""

    def __init__(
        self,
        backend: Backend,
        name: str = "model",
        max_wait: float = MAX_WAIT_S,
        max_rows: int = MAX_ROWS,
        max_queue: int = MAX_QUEUE,
        pass_tokens: int = PASS_TOKENS,
        long_tokens: int = LONG_TOKENS,
        piece_tokens: int = PIECE_TOKENS,
        deadline: float = DEADLINE_S,
    ) -> None:
        self.backend, self.name = backend, name
        self.max_wait, self.max_rows, self.max_queue = max_wait, max_rows, max_queue
        self.pass_tokens, self.long_tokens, self.deadline = pass_tokens, long_tokens, deadline
        self.piece_tokens = piece_tokens
        self.short: deque[Job] = deque()  # waiting, oldest first; a cancelled one holds no place
        self.long: deque[Job] = deque()
        self.ready = threading.Condition()
        self.stopping = False
        self.last_long = False  # the last pass was a long one: shorts go next
        self.current: tuple[Job, Generator] | None = None  # the long job being scored, piece by piece
        self.stats = BatchStats()
        self.thread = threading.Thread(target=self._run, name=f"walla-serve-{name}", daemon=True)

    def start(self) -> Batcher:
        self.thread.start()
        return self

    def stop(self) -> None:
        with self.ready:
            self.stopping = True
            self.ready.notify_all()
        self.thread.join(timeout=30)
        with self.ready:
            for j in (*self.short, *self.long):  # never scored: their callers hear so instead of waiting
                j.future.cancel()
            self.short.clear()
            self.long.clear()

    @property
    def queued(self) -> int:
        """Jobs in the lanes, cancelled ones included until the worker or `waiting` drops them."""
        return len(self.short) + len(self.long)

    def waiting(self) -> int:
        """Jobs waiting whose callers still wait (a cancelled job is dropped here: its place is free)."""
        with self.ready:
            self._drop_cancelled()
            return len(self.short) + len(self.long)

    def _drop_cancelled(self) -> None:
        for lane in (self.short, self.long):
            if any(j.future.cancelled() for j in lane):
                kept = [j for j in lane if not j.future.cancelled()]
                lane.clear()
                lane.extend(kept)

    def submit(self, items: Sequence[Item], tokens: Sequence[int] | None = None) -> Future:
        """Queue one request's prompts (`tokens`: each prompt's count, else estimated)."""
        items = list(items)
        counts = list(tokens) if tokens is not None else [estimate_tokens(p) for p, _ in items]
        job = Job(items, sum(counts))
        with self.ready:
            if len(self.short) + len(self.long) >= self.max_queue:
                self._drop_cancelled()  # callers that went away free their places
            if len(self.short) + len(self.long) >= self.max_queue:
                raise QueueFull(f"{self.name}: {self.max_queue} requests are waiting")
            (self.long if job.tokens > self.long_tokens else self.short).append(job)
            self.ready.notify()
        return job.future

    def _expire(self) -> None:
        """Fail the jobs that waited past the deadline (their callers get 503 with Retry-After)."""
        now = time.perf_counter()
        for lane in (self.short, self.long):
            while lane and now - lane[0].queued_at > self.deadline:  # oldest first: the rest are younger
                job = lane.popleft()
                if job.future.set_running_or_notify_cancel():
                    job.future.set_exception(
                        QueueTimeout(
                            f"{self.name}: waited {now - job.queued_at:.1f} s, over {self.deadline:g} s"
                        )
                    )
                    self.stats.timed_out += 1

    def _take(self) -> list[Job] | None:
        """The next short pass's jobs; [] when the next pass is a piece of `current` (None: the batcher stops)."""
        with self.ready:
            while True:
                self._drop_cancelled()
                self._expire()
                if self.stopping:
                    return None
                if (self.current or self.long) and (not self.short or not self.last_long):
                    self.last_long = True
                    if self.current is None:
                        job = self.long.popleft()
                        if not job.future.set_running_or_notify_cancel():
                            continue  # its caller went away
                        self.current = (job, self._steps(job.items, self.piece_tokens))
                    return []
                if self.short:
                    break
                self.ready.wait(self.deadline if self.long or self.short else None)
            first = self.short.popleft()
            self.last_long = False
            until = time.perf_counter() + self.max_wait
            rows, tokens = len(first.items), first.tokens
            while not self.stopping:  # the wait window: more short jobs, until the pass would be full
                left = until - time.perf_counter()
                waiting_rows = sum(len(j.items) for j in self.short)
                waiting_tokens = sum(j.tokens for j in self.short)
                if (
                    left <= 0
                    or rows + waiting_rows >= self.max_rows
                    or tokens + waiting_tokens >= self.pass_tokens
                ):
                    break
                self.ready.wait(left)
            batch, kept = [first], []
            for job in sorted(self.short, key=lambda j: j.tokens):  # shortest first (stable: oldest first)
                if rows + len(job.items) <= self.max_rows and tokens + job.tokens <= self.pass_tokens:
                    batch.append(job)
                    rows, tokens = rows + len(job.items), tokens + job.tokens
            taken = {id(j) for j in batch}
            kept = [j for j in self.short if id(j) not in taken]
            self.short.clear()
            self.short.extend(kept)
            return batch

    def _run(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            if not batch:
                self._piece()
                continue
            live = [j for j in batch if j.future.set_running_or_notify_cancel()]  # callers still waiting
            if live:
                self._score(live)

    def _steps(self, items: Sequence[Item], chunk_tokens: int | None):
        """A pass as a generator of its pieces (extract/scoring.py score_steps); on the model's Ray worker
        (serve/remote.py RemoteBackend) one remote pass."""
        remote = getattr(self.backend, "features", None)
        if remote is not None:
            return remote(items)
        return (yield from score_steps(self.backend, items, chunk_tokens))

    def _features(self, items: Sequence[Item]) -> list:
        """One whole pass."""
        steps = self._steps(items, None)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def _piece(self) -> None:
        """One pass of the long job being scored: its next piece, or its last (then its caller's answer)."""
        job, steps = self.current
        self.stats.long_passes += 1
        try:
            next(steps)
            return
        except StopIteration as done:
            out = done.value
            job.future.set_result(out)
            self.stats.passes += 1
            self.stats.prompts += len(out)
            self.stats.tokens += sum(o[2] for o in out)
        except Exception as e:  # noqa: BLE001 - handed to that request's caller
            job.future.set_exception(e)
        self.current = None

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
