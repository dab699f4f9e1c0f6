"""Copying hidden states from feature sets into a scenario's per-slot [N, H] arrays (store/scenario/_assemble.py).

Each slot of an agent reads, per question, the hidden state of the prompt variant the context rule gave
it; M copies of one model read the same two feature sets (none + relevant) once, block by block.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import numpy as np
from walla.store.features import HiddenReader
from walla.store.schema import VARIANT_CODE, VARIANTS

BLOCK_BYTES = 32 << 20  # hidden rows read per block and variant: large sequential reads, bounded extra memory


class PartRows(Protocol):
    """One dataset's rows of a scenario (store/scenario/_sources.py `Part`)."""

    fs: dict  # (model, variant) -> FeatureSet
    src: dict  # (model, variant) -> [n] row of each question in that feature set
    offset: int  # first scenario row of this part
    n: int


def _read_rows(reader: HiddenReader, rows: np.ndarray, out: np.ndarray) -> None:
    """out[i] = hidden[rows[i]]; contiguous rows are one direct read, others are read in sorted runs."""
    n = rows.size
    if n and rows[-1] - rows[0] == n - 1 and (n == 1 or np.all(np.diff(rows) == 1)):
        reader.read_into(int(rows[0]), int(rows[-1]) + 1, out)
        return
    order = np.argsort(rows, kind="stable")
    srt = rows[order]
    cuts = [0, *(np.flatnonzero(np.diff(srt) != 1) + 1).tolist(), n]
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        out[order[a:b]] = reader.read(int(srt[a]), int(srt[b - 1]) + 1)


def fill_hidden(
    outs: list[np.ndarray],
    slots: list[int],
    model: str,
    variant: np.ndarray,
    part: PartRows,
    budget: int,
    pool: ThreadPoolExecutor,
) -> None:
    """Write the hidden rows of every slot of `model` for one part.

    Per block of rows, each variant's rows are read once into one stacked buffer [V * B, H]; each slot's
    output block is then a single `np.take` from it (row i from the slot's variant of row i): every output
    byte is written once, with no temporaries. The per-slot takes run on `pool`: writing fresh output
    pages is most of the cost, and numpy releases the GIL while copying.
    """
    keys = [v for v in VARIANTS if (model, v) in part.fs]
    readers = [HiddenReader(part.fs[(model, v)].path / "hidden.zarr") for v in keys]
    h = readers[0].shape[1]
    chunk = readers[0].chunk_rows
    # block rows: <= BLOCK_BYTES per variant and <= `budget` bytes for the whole stack (extra memory stays a
    # small fraction of the output), whole chunks so reads are aligned
    block = max(1, min(BLOCK_BYTES, budget // len(keys)) // (2 * h))
    block = min(max(chunk, block // chunk * chunk), part.n)
    stack = np.empty(
        (len(keys) * block, h), np.float16
    )  # [V * B, H]: variant i's rows at [i * B, i * B + nb)
    lut = np.zeros(len(VARIANTS), np.int64)  # variant code -> row offset of its block in the stack
    for i, v in enumerate(keys):
        lut[VARIANT_CODE[v]] = i * block

    def take(s: int, j0: int, j1: int, rows: np.ndarray) -> None:
        dst = outs[s][part.offset + j0 : part.offset + j1]  # [nb, H] view into the slot's output
        np.take(stack, rows, axis=0, out=dst, mode="clip")  # mode=clip: no buffered copy of the output

    for j0 in range(0, part.n, block):
        j1 = min(part.n, j0 + block)
        nb = j1 - j0
        codes = variant[part.offset + j0 : part.offset + j1][:, slots]  # [nb, S]
        for i, v in enumerate(keys):
            if (codes == VARIANT_CODE[v]).any():
                _read_rows(readers[i], part.src[(model, v)][j0:j1], stack[i * block : i * block + nb])
        base = np.arange(nb)
        jobs = [pool.submit(take, s, j0, j1, lut[codes[:, col]] + base) for col, s in enumerate(slots)]
        for job in jobs:
            job.result()  # re-raises a worker's exception; the stack is refilled only after every take
