"""TRAIN_SCHEMA is pinned by numbers (issue 28): every method's golden run matches the digests stored for the
current schema, and a change of the numbers fails with the instruction to bump it (train/golden.py)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from walla.train import golden
from walla.train.methods import REGISTRY
from walla.train.runs import TRAIN_SCHEMA


@pytest.fixture(scope="module")
def current() -> dict[str, dict]:
    return golden.compute()


def test_training_numbers_match_the_digests_of_train_schema(current):
    assert set(current) == set(REGISTRY)  # every method, each with its payouts where it has them
    assert {"wagers", "payouts", "advantage"} <= set(current["walla-i"]["columns"])
    problems = golden.check(golden.read_golden(), current)
    assert not problems, "\n".join(problems)


def _moved(digests: dict, method: str, by: float) -> dict:
    out = copy.deepcopy(digests)
    out[method]["proj"][3] += by * out[method]["rms"]
    return out


def test_moved_numbers_fail_and_say_to_bump_the_schema(current):
    stored = {"schema": TRAIN_SCHEMA, "setup": golden.setup_id(), "methods": current}
    assert golden.check(stored, _moved(current, "walla-ii", 0.1 * golden.TOLERANCE)) == []  # noise passes
    (line,) = golden.check(stored, _moved(current, "walla-ii", 10 * golden.TOLERANCE))
    assert line.startswith(
        f"the training numbers changed but TRAIN_SCHEMA did not (still {TRAIN_SCHEMA}): walla-ii: moved"
    )
    assert "Bump TRAIN_SCHEMA in train/runs.py" in line and line.endswith(
        "python -m walla.train.golden --write"
    )
    (line,) = golden.check(stored, current, schema=TRAIN_SCHEMA + 1)  # bumped: the digests are regenerated
    assert f"holds digests of TRAIN_SCHEMA {TRAIN_SCHEMA}, the code is schema {TRAIN_SCHEMA + 1}" in line
    (line,) = golden.check(stored, current, setup="another")  # golden.py trains something else: regenerate
    assert line.startswith("golden.json holds digests of another golden setup") and "bump" not in line.lower()
    fewer = {**stored, "methods": {k: v for k, v in current.items() if k != "uniform"}}
    (line,) = golden.check(fewer, current)  # a new method: its digest is added, no bump needed
    assert line.startswith("golden digests missing for ['uniform']")


def test_the_sketch_passes_float_noise_and_catches_a_change():
    rng = np.random.default_rng(0)
    values = rng.random(900)
    stored = {"schema": 1, "methods": {"m": {"columns": ["x"], **golden.sketch(values)}}}
    noisy = values * (1 + rng.normal(0, 1e-7, 900))  # float32 round-off of every value
    assert golden.changes(stored, {"m": {"columns": ["x"], **golden.sketch(noisy)}}) == []
    changed = values.copy()
    changed[17] += 1e-2  # one value of 900
    (line,) = golden.changes(stored, {"m": {"columns": ["x"], **golden.sketch(changed)}})
    assert line.startswith("m: moved by")
    (line,) = golden.changes(stored, {"m": {"columns": ["x", "y"], **golden.sketch(values)}})
    assert "columns ['x'] x 900 values -> ['x', 'y']" in line


def test_write_refuses_moved_digests_under_the_same_schema(current, tmp_path):
    path = tmp_path / "golden.json"
    golden.write(current, path, schema=7, setup="s")
    golden.write(current, path, schema=7, setup="s")  # unchanged: fine
    with pytest.raises(ValueError, match="digests of TRAIN_SCHEMA 7 moved .walla-i: .*bump TRAIN_SCHEMA"):
        golden.write(_moved(current, "walla-i", 1e-2), path, schema=7, setup="s")
    assert golden.read_golden(path)["methods"] == current
    golden.write(_moved(current, "walla-i", 1e-2), path, schema=8, setup="s")  # bumped: stored
    assert golden.read_golden(path)["schema"] == 8
    golden.write(current, path, schema=8, setup="t")  # another golden setup: stored
    assert golden.read_golden(path)["setup"] == "t"
    assert golden.setup_id() == golden.setup_id() == golden.read_golden()["setup"]
