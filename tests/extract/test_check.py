"""`walla check` metrics, tolerances and CLI errors on synthetic backend results (no model)."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner
from walla.extract.backends import ScoreResult
from walla.extract.check import TOLERANCES, app, compare, format_table, violations


def result(seed: int, noise: float = 0.0, base: ScoreResult | None = None) -> ScoreResult:
    rng = np.random.default_rng(seed)
    if base is None:
        return ScoreResult(
            rng.normal(-3, 1, (6, 4)).astype(np.float32),
            rng.normal(0, 1, (6, 8)).astype(np.float32),
            rng.uniform(1, 4, 6).astype(np.float32),
            np.arange(5, 11, dtype=np.int32),
        )
    return ScoreResult(
        base.raw_logprobs + noise * rng.normal(size=base.raw_logprobs.shape).astype(np.float32),
        base.hidden + noise * rng.normal(size=base.hidden.shape).astype(np.float32),
        base.prompt_nll + noise,
        base.n_tokens.copy(),
    )


COLS = [[0, 1, 2, 3]] * 3 + [[0, 1]] * 3  # two 4-option and three 2-option questions


def test_identical_results_pass_and_metrics_are_exact():
    a = result(0)
    m = compare(a, result(0, 0.0, a), COLS)
    assert m["lp_max"] == 0 and m["argmax"] == 1 and m["cos_min"] == pytest.approx(1) and m["nll_max"] == 0
    assert violations(m, TOLERANCES["float32"]) == []


def test_only_the_options_of_each_question_count():
    a = result(0)
    b = result(0, 0.0, a)
    b.raw_logprobs[3:, 2:] -= 50.0  # columns the 2-option questions do not have
    assert compare(a, b, COLS)["lp_max"] == 0


def test_noise_beyond_tolerance_fails_with_named_metrics():
    a = result(0)
    m = compare(a, result(1, 0.05, a), COLS)
    bad = violations(m, TOLERANCES["float32"])
    assert any(b.startswith("lp_max") for b in bad) and any(b.startswith("nll_max") for b in bad)
    assert violations(m, {"lp_max": 1, "lp_mean": 1, "argmax": 0, "cos_min": 0, "nll_max": 1}) == []
    b = result(0, 0.0, a)
    b.n_tokens[0] += 1
    assert "different tokenization" in violations(compare(a, b, COLS), TOLERANCES["float32"])[-1]
    table = format_table([{"name": "vllm vs hf", "n": 6, "metrics": m, "violations": bad}])
    assert "vllm vs hf" in table and "FAIL: lp_max" in table


def test_cli_errors_are_one_line():
    res = CliRunner().invoke(
        app, ["check", "--model", "smollm2-135m", "--dataset", "arc-challenge", "--backends", "hf,tgi"]
    )
    assert res.exit_code == 1 and "unknown tgi" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(app, ["check", "--model", "nope", "--dataset", "arc-challenge"])
    assert res.exit_code == 2 and "unknown model" in res.output.lower()
