"""Option-token resolution (SPEC §1.5), renormalization, length-bucketed batching."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from walla.extract.scoring import plan_batches, renormalize, resolve_option_token_ids, restore_order


def word_encode(text: str) -> list[int]:
    return [hash(w) % 1000 for w in text.replace(":", " : ").split()]


def test_first_new_token_is_scored():
    enc = {"Answer:": [1, 2], "Answer:A": [1, 2, 7], "Answer:YES": [1, 2, 8, 9]}
    ids = resolve_option_token_ids(enc.__getitem__, lambda s: [99], "Answer:", ["A", "YES"])
    assert ids == {"A": 7, "YES": 8}  # multi-token options: first sub-token


def test_fallback_to_bare_single_token_and_error_naming_option():
    enc = {"Answer:": [1, 2], "Answer:A": [1, 5]}  # merges across the boundary: no extension
    ids = resolve_option_token_ids(enc.__getitem__, {"A": [42]}.__getitem__, "Answer:", ["A"])
    assert ids == {"A": 42}
    with pytest.raises(ValueError, match="option 'A'.*2 tokens"):
        resolve_option_token_ids(enc.__getitem__, {"A": [4, 2]}.__getitem__, "Answer:", ["A"])


def test_two_options_on_one_token_is_an_error():
    enc = {"Q": [1], "Q yes": [1, 3], "Q yeah": [1, 3]}
    with pytest.raises(ValueError, match="same token id 3"):
        resolve_option_token_ids(enc.__getitem__, enc.__getitem__, "Q", [" yes", " yeah"])


def test_renormalize_is_log_softmax():
    raw = np.array([-3.0, -1.0, -7.5], dtype=np.float32)
    out = renormalize(raw)
    np.testing.assert_allclose(np.exp(out), np.exp(raw) / np.exp(raw).sum(), rtol=1e-6)
    assert abs(np.logaddexp.reduce(out.astype(np.float64))) < 1e-6


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=60), st.integers(1, 2000))
def test_batches_cover_every_row_once_under_budget(lengths, budget):
    batches = plan_batches(lengths, budget)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(len(lengths)))
    for b in batches:
        width = max(lengths[i] for i in b)
        assert len(b) == 1 or len(b) * width <= budget
    firsts = [max(lengths[i] for i in b) for b in batches]
    assert firsts == sorted(firsts, reverse=True)  # longest first
    res = [np.array([lengths[i] for i in b]) for b in batches]
    np.testing.assert_array_equal(restore_order(batches, res, len(lengths)), lengths)


def test_restore_order_detects_lost_rows():
    with pytest.raises(AssertionError, match="lost"):
        restore_order([np.array([0, 2])], [np.zeros(2)], 3)
