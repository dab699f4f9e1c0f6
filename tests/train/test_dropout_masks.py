"""train/wagers/_dropout.py draws the very masks of the formula it replaces, `gen.random(shape, float32) < keep`
per generator and width in turn: raw-stream path, float fallback (odd sizes, a buffered half, other keeps),
threads and the step drawn ahead."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from walla.train.wagers import DropoutMasks, keep_mask, raw_limit


@pytest.mark.parametrize("keep", [0.9, 0.5, 1 - 0.3, 2 / 3, 1 - 1e-9, 1e-9, 0.75])
@pytest.mark.parametrize("shape", [(3, 50, 512), (2, 7, 9), (1, 1, 1), (4, 33, 5)])
def test_keep_mask_is_the_float_formula(keep, shape):
    ref, new = np.random.default_rng([18, 1]), np.random.default_rng([18, 1])
    for _ in range(3):  # consecutive draws: the generators stay in step
        want = ref.random(shape, dtype=np.float32) < keep
        got = np.empty(shape, dtype=bool)
        keep_mask(new, keep, got)
        np.testing.assert_array_equal(got, want)
    a, b = ref.bit_generator.state, new.bit_generator.state
    assert a["state"] == b["state"] and a["has_uint32"] == b["has_uint32"]
    assert not a["has_uint32"] or a["uinteger"] == b["uinteger"]  # a stale half is never read


def test_threshold_edges():
    """Exactly the k (= u >> 8) whose float32 k / 2^24 compares below keep pass."""
    for keep in (0.9, 0.1, 0.5, 1 / 3):
        limit = raw_limit(keep) >> 8
        k = np.array([limit - 1, limit], dtype=np.float32) * np.float32(2.0**-24)
        assert (k < keep).tolist() == [True, False]
    assert raw_limit(1.0) is None and raw_limit(0.0) is None


def _reference(seeds, m, n_kinds, widths, keep, sizes):
    """The masks as train/wagers/_training.py drew them before: per width, per seed its wager generator's
    [M, b, w] then its diagnostic generator's [(D-1) M, b, w], concatenated."""
    gens = [np.random.default_rng([s, 1]) for s in seeds]
    diag = [np.random.default_rng([s, 2]) for s in seeds]
    steps = []
    for b in sizes:
        out = []
        for w in widths:
            parts = []
            for g, dg in zip(gens, diag, strict=True):
                parts.append(g.random((m, b, w), dtype=np.float32) < keep)
                if n_kinds > 1:
                    parts.append(dg.random(((n_kinds - 1) * m, b, w), dtype=np.float32) < keep)
            out.append(np.concatenate(parts))
        steps.append(out)
    return steps


@pytest.mark.parametrize(("seeds", "n_kinds"), [([18], 1), ([18, 19, 20], 1), ([18, 19], 3)])
def test_stream_equals_the_old_masks(seeds, n_kinds):
    from walla.train.wagers._training import _dropout, _Layout

    m, widths, sizes = 3, (16, 7), [10, 10, 5, 10, 10, 5]

    class Cfg:
        hidden, dropout = widths, 0.1

    layout = _Layout(len(seeds), n_kinds, m)
    masks = _dropout(seeds, layout, Cfg, "cpu")
    try:
        got = [masks.take(b, sizes[i + 1] if i + 1 < len(sizes) else None) for i, b in enumerate(sizes)]
    finally:
        masks.close()
    want = _reference(seeds, m, n_kinds, widths, 0.9, sizes)
    for g_step, w_step in zip(got, want, strict=True):
        for g, w in zip(g_step, w_step, strict=True):
            assert isinstance(g, torch.Tensor) and g.dtype == torch.bool
            np.testing.assert_array_equal(g.numpy(), w)


def test_a_step_drawn_ahead_for_another_size_is_refused():
    masks = DropoutMasks([np.random.default_rng(0)], [slice(0, 2)], (4,), 0.9, "cpu")
    try:
        masks.take(5, next_b=5)
        with pytest.raises(RuntimeError, match="drawn for a batch of 5 rows, the step has 3"):
            masks.take(3)
    finally:
        masks.close()
