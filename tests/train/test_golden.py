"""TRAIN_SCHEMA is pinned by numbers (issue 28): every method's golden run matches the digests stored for the
current schema, and a change of the numbers fails with the instruction to bump it (train/golden/_check.py)."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
from walla.train.engine import _fabric as engine
from walla.train.golden import _check as golden
from walla.train.golden import _setup as golden_setup
from walla.train.methods import REGISTRY
from walla.train.runs import TRAIN_SCHEMA
from walla.train.wagers import StackedHeads
from walla.train.wagers import _stopping as online_stop
from walla.train.wagers import _training as wager_training


@pytest.fixture(scope="module")
def current() -> dict[str, dict]:
    return golden.compute()


def test_training_numbers_match_the_digests_of_train_schema(current):
    assert {m for m in current if "@" not in m} == set(REGISTRY)  # every method, with its payouts if any
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
    assert "Bump TRAIN_SCHEMA in train/runs/_identity.py" in line and line.endswith(
        "python -m walla.train.golden --write"
    )
    (line,) = golden.check(stored, current, schema=TRAIN_SCHEMA + 1)  # bumped: the digests are regenerated
    assert f"holds digests of TRAIN_SCHEMA {TRAIN_SCHEMA}, the code is schema {TRAIN_SCHEMA + 1}" in line
    (line,) = golden.check(stored, current, setup="another")  # golden/setup.py changed: regenerate
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


# ------------------------------------------------------------------ every numeric path (issue 37, finding 3)


def _path_digests(*paths: str) -> dict[str, dict]:
    return {f"{m}@{p}": d for p, ms in golden.compute_paths(paths).items() for m, d in ms.items()}


def test_every_selectable_numeric_path_has_a_digest():
    stored = golden.read_golden()["methods"]
    assert set(golden_setup.PATHS) == {
        "bf16-mixed",
        "projection",
        "batched-seeds",
        "early-stopping",
        "unstandardized",
        "calibrated",
        "join",
    }
    for path, spec in golden_setup.PATHS.items():
        assert {f"{m}@{path}" for m in spec["methods"]} <= set(stored)
    assert stored["walla-i@batched-seeds"]["n"] == 2 * stored["walla-i"]["n"]  # both seeds of one fit
    assert "agent_probs" in stored["walla-i@calibrated"]["columns"]  # the calibrated probs it pooled


def test_bf16_true_forced_where_bf16_mixed_is_asked_fails_the_golden_check(monkeypatch):
    """The mutation of the issue: train/engine/_fabric.py handing Lightning bf16-true for a bf16-mixed run."""
    real = engine.Fabric

    def forced(*args, precision=None, **kw):
        return real(*args, precision="bf16-true" if precision == "bf16-mixed" else precision, **kw)

    monkeypatch.setattr(engine, "Fabric", forced)
    # WALLA's fit runs under it (stacked-gen's mixes dtypes in bf16-true and raises: caught anyway)
    monkeypatch.setitem(
        golden_setup.PATHS, "bf16-mixed", {**golden_setup.PATHS["bf16-mixed"], "methods": ["walla-i"]}
    )
    moved = golden.changes(golden.read_golden(), _path_digests("bf16-mixed"))
    assert any(line.startswith("walla-i@bf16-mixed: moved by") for line in moved), moved


def test_a_projection_bias_dropped_in_predict_fails_the_golden_check(monkeypatch):
    """The mutation of the issue: StackedHeads.predict folding the projection without its bias bp."""

    def predict(self, x):
        if not self.n_proj or x.shape[1] * (x.shape[2] + self.dims[2]) <= x.shape[2] * self.dims[2]:
            return self(x)
        wp, w1, b1 = self.weights[0], self.weights[1], self.biases[1]
        h = torch.relu(torch.baddbmm(b1.unsqueeze(1), x, torch.bmm(wp, w1)))  # bp left out
        for j in range(2, len(self.weights)):
            h = torch.baddbmm(self.biases[j].unsqueeze(1), h, self.weights[j])
            h = torch.relu(h) if j < len(self.weights) - 1 else h
        return h.squeeze(-1)

    monkeypatch.setattr(StackedHeads, "predict", predict)
    moved = golden.changes(golden.read_golden(), _path_digests("projection"))
    assert any(line.startswith("walla-i@projection: moved by") for line in moved), moved


def test_the_early_stopping_path_stops_early():
    (runs_stopped,) = golden.compute_paths(["early-stopping"]).values()  # _check_stopped raised otherwise
    one_seed = golden.read_golden()["methods"]["walla-i"]["n"]
    assert runs_stopped["walla-i"]["n"] == 3 * one_seed + 3  # three seeds, and where each stopped
    assert runs_stopped["walla-i"]["columns"][-1] == "logged_steps"


@pytest.mark.parametrize("by", [1, -1])
def test_early_stopping_patience_off_by_one_fails_the_golden_check(monkeypatch, by):
    """Issue 47, item 2: walla's online early stopping counting its patience one batch long or short."""
    real = online_stop.OnlineStop.__init__

    def init(self, cfg, *args, **kwargs):
        real(self, dataclasses.replace(cfg, patience=cfg.patience + by), *args, **kwargs)

    monkeypatch.setattr(online_stop.OnlineStop, "__init__", init)
    moved = golden.changes(golden.read_golden(), _path_digests("early-stopping"))
    assert any(line.startswith("walla-i@early-stopping: moved by") for line in moved), moved


def test_the_pooled_forecasts_alone_see_patience_off_by_one(monkeypatch):
    """Not only where the runs stopped: their predictions move too (the path's settings were chosen so)."""
    monkeypatch.setitem(
        golden_setup.PATHS, "early-stopping", {**golden_setup.PATHS["early-stopping"], "steps": False}
    )
    stored = {"methods": _path_digests("early-stopping")}
    real = online_stop.OnlineStop.__init__
    for by in (1, -1):

        def init(self, cfg, *args, by=by, **kwargs):
            real(self, dataclasses.replace(cfg, patience=cfg.patience + by), *args, **kwargs)

        monkeypatch.setattr(online_stop.OnlineStop, "__init__", init)
        moved = golden.changes(stored, _path_digests("early-stopping"))
        assert any(line.startswith("walla-i@early-stopping: moved by") for line in moved), (by, moved)


def test_the_standardize_false_path_standardized_anyway_fails_the_golden_check(monkeypatch):
    """Issue 47, item 2: the heads trained on standardized hidden states though `standardize: false`."""
    real = wager_training._train_rows

    def train_rows(data, cfg, *args, **kwargs):
        return real(data, dataclasses.replace(cfg, standardize=True), *args, **kwargs)

    monkeypatch.setattr(wager_training, "_train_rows", train_rows)
    moved = golden.changes(golden.read_golden(), _path_digests("unstandardized"))
    assert any(line.startswith("walla-i@unstandardized: moved by") for line in moved), moved


def test_float32_features_rounded_to_float16_fail_the_golden_check(monkeypatch):
    """Issue 47, item 2: the unstandardized path feeding float32 features to the heads through float16."""
    real = wager_training.stack_hidden
    monkeypatch.setattr(wager_training, "stack_hidden", lambda *a, **k: real(*a, **k).half())
    moved = golden.changes(golden.read_golden(), _path_digests("unstandardized"))
    assert any(line.startswith("walla-i@unstandardized: moved by") for line in moved), moved


@pytest.mark.gpu
def test_cuda_training_numbers_match_their_digests():
    """The golden runs and every path on a CUDA device (its own init draw, cuBLAS, bf16-mixed on the GPU),
    against train/golden/golden_cuda.json within golden.CUDA_TOLERANCE; written there by
    `python -m walla.train.golden --write --device cuda` on a CUDA machine."""
    current = golden.compute(device="cuda")
    file, tolerance, _ = golden.golden_file("cuda")
    assert tolerance == golden.CUDA_TOLERANCE and file.name == "golden_cuda.json"
    problems = golden.check(golden.read_golden(file), current, device="cuda")
    assert not problems, "\n".join(problems)


def test_the_cuda_golden_reports_missing_digests_with_the_command_that_writes_them():
    (line,) = golden.check({}, {}, device="cuda")
    assert line == (
        "golden_cuda.json holds digests of TRAIN_SCHEMA None, the code is schema "
        f"{TRAIN_SCHEMA}: regenerate them: python -m walla.train.golden --write --device cuda (on a CUDA machine)"
    )
