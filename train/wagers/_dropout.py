"""WALLA's dropout keep-masks: drawn on the host from per-seed numpy generators, the same bits as ever, faster.

    masks = DropoutMasks(gens, rows, widths, keep=0.9, device="cuda")   # one generator per block of heads
    m = masks.take(b, next_b)       # [G, b, w] bool per width, on the device; the next step's drawn meanwhile
    masks.close()

A mask is `gen.random((rows, b, w), dtype=np.float32) < keep` (train/wagers/_training.py fixed that formula;
tests/train/test_dropout_masks.py checks every path against it). At the paper's width a step of 5 seeds x
12 agents draws 4.6M of them, ~25 ms of one host core, more than the device step itself on a GPU (issue 31:
a 5-seed fit took 3x a 1-seed one, 53% of it in device steps). Three things cut that without changing a bit:

- `keep_mask` draws the raw stream: numpy's float32 is (next_uint32 >> 8) * 2^-24, and PCG64's next_uint32
  returns the low then the high half of one next_uint64, so n / 2 raw 64-bit draws viewed as uint32 (little
  endian) are the same n values, compared as integers against the threshold the float comparison implies;
- the generators are independent, so each one's block is drawn in its own thread (numpy releases the GIL
  while it fills);
- `take` starts the next step's masks before it returns this step's, so they are drawn while the device
  computes (the generators are used in the same order, so the masks are the same).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch
from walla.train.engine import to_device

FLOAT32_STEPS = 2**24  # numpy's float32 in [0, 1) is k * 2^-24, k = next_uint32 >> 8


@functools.cache
def raw_limit(keep: float) -> int | None:
    """The L with (u >> 8) * 2^-24 < keep (as numpy compares a float32 array with `keep`) <=> u < L, for
    every uint32 u; None when no such L lies inside the uint32 range (then the float path is used)."""
    k0 = int(keep * FLOAT32_STEPS)
    ks = np.arange(k0 - 4, k0 + 5)
    ks = ks[(ks >= 0) & (ks <= FLOAT32_STEPS)]
    below = (ks.astype(np.float32) * np.float32(1.0 / FLOAT32_STEPS)) < keep
    if len(ks) == 0 or not below[0] or below[-1]:
        return None
    limit = int(ks[0] + below.sum()) << 8
    return limit if limit < 2**32 else None  # keep rounds to 1 in float32: every u passes


def keep_mask(gen: np.random.Generator, keep: float, out: np.ndarray) -> None:
    """out[...] = gen.random(out.shape, dtype=np.float32) < keep, bit for bit (module docstring)."""
    bits, limit = gen.bit_generator, raw_limit(keep)
    raw = (
        limit is not None
        and out.size % 2 == 0
        and sys.byteorder == "little"
        and isinstance(bits, np.random.PCG64)
        and not bits.state["has_uint32"]  # a buffered half would come first on the float path
    )
    if not raw:
        np.less(gen.random(out.shape, dtype=np.float32), keep, out=out)
        return
    np.less(bits.random_raw(out.size // 2).view(np.uint32).reshape(out.shape), limit, out=out)


class DropoutMasks:
    """Keep-masks of stacked heads, block by block: generator j draws rows `rows[j]` (a slice of the G
    heads) of every width in turn, as one step's `gen.random((rows, b, w), float32) < keep` per width."""

    def __init__(
        self,
        gens: Sequence[np.random.Generator],
        rows: Sequence[slice],
        widths: Sequence[int],
        keep: float,
        device: str | torch.device,
    ) -> None:
        self.gens, self.rows, self.widths = list(gens), list(rows), tuple(widths)
        self.n_heads = max(r.stop for r in self.rows)
        self.keep, self.device = keep, device
        self.pool = ThreadPoolExecutor(max_workers=max(1, min(len(self.gens), os.cpu_count() or 1)))
        self.ahead: tuple[int, list[np.ndarray], list[Future]] | None = None

    def _fill(self, j: int, out: list[np.ndarray]) -> None:
        for o in out:  # every width of block j, in order: the generator's sequence
            keep_mask(self.gens[j], self.keep, o[self.rows[j]])

    def _start(self, b: int) -> tuple[int, list[np.ndarray], list[Future]]:
        out = [np.empty((self.n_heads, b, w), dtype=bool) for w in self.widths]
        return b, out, [self.pool.submit(self._fill, j, out) for j in range(len(self.gens))]

    def take(self, b: int, next_b: int | None = None) -> list[torch.Tensor]:
        """This step's masks ([G, b, w] bool per width, on the device); starts drawing the next step's
        (`next_b` rows; None: no next step)."""
        if self.ahead is None:
            self.ahead = self._start(b)
        size, out, jobs = self.ahead
        for job in jobs:
            job.result()
        if size != b:  # the generators have drawn another step's shape: the masks would differ from before
            raise RuntimeError(f"dropout masks drawn for a batch of {size} rows, the step has {b}")
        self.ahead = self._start(next_b) if next_b else None
        return [to_device(o, self.device) for o in out]

    def close(self) -> None:
        """Wait for a step drawn ahead and never taken (early stop), then free the threads."""
        self.pool.shutdown(wait=True)
        self.ahead = None
