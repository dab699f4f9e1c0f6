"""Split assignment (SPEC §3.1)."""

from __future__ import annotations

import numpy as np
import pytest
from walla.extract.splits import SplitProtocol, assign_splits, split_counts


def test_largest_remainder_counts():
    assert split_counts(10, (0.8, 0.1, 0.1)) == [8, 1, 1]
    assert split_counts(7, (0.8, 0.1, 0.1)) == [5, 1, 1]  # 5.6/0.7/0.7: the two leftovers go to the .7 parts
    assert split_counts(5, (0.8, 0.1, 0.1)) == [4, 1, 0]  # tie .5/.5: val before test
    assert sum(split_counts(99_842, (0.8, 0.1, 0.1))) == 99_842


def test_uniform_is_the_seeded_permutation_cut():
    res = assign_splits([0] * 20, SplitProtocol("uniform", (0.8, 0.1, 0.1), 42))
    perm = np.random.RandomState(42).permutation(20)
    want = ["train"] * 16 + ["val"] * 2 + ["test"] * 2
    for pos, idx in enumerate(perm):
        assert res.split[idx] == want[pos]
    assert res.counts == {"train": 16, "val": 2, "test": 2}


def test_balanced_binary_truncates_to_minority():
    labels = [0] * 30 + [1] * 10
    res = assign_splits(labels, SplitProtocol("balanced_binary", (0.8, 0.1, 0.1), 18))
    kept = [(lab, s) for lab, s in zip(labels, res.split, strict=True) if s is not None]
    assert res.dropped == 20 and len(kept) == 20
    for cls in (0, 1):
        splits = [s for lab, s in kept if lab == cls]
        assert splits.count("train") == 8 and splits.count("val") == 1 and splits.count("test") == 1


def test_none_and_given_modes():
    assert assign_splits([0, 1], SplitProtocol("none")).split == ["test", "test"]
    assert assign_splits([0, 1], SplitProtocol("given"), ["val", "train"]).split == ["val", "train"]
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        assign_splits([0], SplitProtocol("given"), ["dev"])


def test_bad_protocols():
    with pytest.raises(ValueError, match="mode must be one of"):
        SplitProtocol("random")
    with pytest.raises(ValueError, match="ratios"):
        SplitProtocol("uniform", (0.5, 0.1, 0.1))
    with pytest.raises(ValueError, match="unknown keys"):
        SplitProtocol.from_dict({"mode": "uniform", "sed": 1})
