"""`walla extract --sample N`: N questions drawn over the whole file (not its first N), the splits' shares
kept, the same draw every time, file order kept."""

from __future__ import annotations

from walla.extract.datasets.rows import Loaded, canonical_row
from walla.extract.datasets.table import build_table
from walla.extract.splits import SplitProtocol


def _loaded(n: int) -> Loaded:
    rows = [
        canonical_row(f"q{i:04d}", f"question {i}", ["a", "b", "c"], i % 3, subject=f"s{i // 100}")
        for i in range(n)
    ]
    return Loaded(rows, [f"row {i}" for i in range(n)], {"data_file": "x"})


def test_a_sample_spans_the_file_keeps_split_shares_and_repeats():
    protocol = SplitProtocol(mode="uniform", ratios=(0.8, 0.1, 0.1), seed=42)
    df, source = build_table(_loaded(1000), protocol, sample=50)
    again, _ = build_table(_loaded(1000), protocol, sample=50)
    ids = df["question_id"].to_list()
    assert len(ids) == 50 and ids == again["question_id"].to_list() and ids == sorted(ids)
    assert df["split"].value_counts().sort("split").rows() == [("test", 5), ("train", 40), ("val", 5)]
    assert len(set(df["subject"].to_list())) >= 8  # not the first 50 rows (one subject)
    assert source["sample"] == 50
    first, src = build_table(_loaded(1000), protocol, limit=50)
    assert set(first["subject"].to_list()) == {"s0"} and "sample" not in src  # --limit's tables unchanged


def test_small_samples_keep_a_val_and_a_test_row():
    protocol = SplitProtocol(mode="uniform", ratios=(0.8, 0.1, 0.1), seed=42)
    for n in (3, 12, 17):
        df, _ = build_table(_loaded(1594), protocol, sample=n)
        splits = df["split"].to_list()
        assert len(splits) == n and "val" in splits and "test" in splits
