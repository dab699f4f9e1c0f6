"""`walla check` metrics, tolerances and CLI errors: synthetic backend results, and the tiny model end to end."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import typer
from test_hf_backend import PROMPTS
from tiny_model import tiny_model, tiny_tokenizer
from typer.testing import CliRunner
from walla.extract import parity as check_mod
from walla.extract.backends import ScoreResult
from walla.extract.backends.hf import HFBackend
from walla.extract.backends.hf import _packed as hf_packed
from walla.extract.backends.registry import backend_options
from walla.extract.config import ExtractConfig
from walla.extract.parity import (
    TIE_GAP,
    TOLERANCES,
    compare,
    format_table,
    judge,
    noise_tolerances,
    run_check,
    violations,
    worst,
)
from walla.extract.parity_cli import app


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


def copy_of(r: ScoreResult) -> ScoreResult:
    return ScoreResult(r.raw_logprobs.copy(), r.hidden.copy(), r.prompt_nll.copy(), r.n_tokens.copy())


COLS = [[0, 1, 2, 3]] * 3 + [[0, 1]] * 3  # three 4-option and three 2-option questions
FP32 = TOLERANCES["float32"]


def test_identical_results_pass_and_metrics_are_exact():
    a = result(0)
    m = compare(a, copy_of(a), COLS)
    assert m["lp_max"] == 0 and m["p_max"] == 0 and m["argmax"] == 1 and m["nll_max"] == 0
    assert m["cos_min"] == pytest.approx(1) and m["identical"] is True
    assert violations(m, FP32) == [] and judge("hf batch=1", m, FP32, exact=True) == []


def test_one_changed_bit_fails_an_exact_row_only():
    a, b = result(0), result(0)
    b.hidden[2, 3] = np.nextafter(b.hidden[2, 3], np.float32(np.inf))  # one ulp of one hidden value
    m = compare(a, b, COLS)
    assert m["identical"] is False and violations(m, FP32) == []  # far inside any tolerance ...
    assert judge("hf batch=1", m, FP32, exact=True) == [
        "hf batch=1 is not bit-identical to hf (batch-invariant backend)"
    ]


def test_only_the_options_of_each_question_count():
    a = result(0)
    b = copy_of(a)
    b.raw_logprobs[3:, 2:] -= 50.0  # columns the 2-option questions do not have
    assert compare(a, b, COLS)["lp_max"] == 0


def test_renormalized_probabilities_ignore_a_shift_of_all_options():
    """A question's options all 0.3 nats lower (another full-vocabulary normalizer): raw lp differ, p do not."""
    a = result(0)
    b = copy_of(a)
    b.raw_logprobs[0] -= 0.3
    m = compare(a, b, COLS)
    assert m["lp_max"] == pytest.approx(0.3, abs=1e-6) and m["p_max"] < 1e-7
    # and p is what the heads see: renormalizing by hand gives the same |Δp|
    b.raw_logprobs[1, 0] += 0.5
    p = lambda x: np.exp(x - np.logaddexp.reduce(x))  # noqa: E731
    want = np.abs(p(a.raw_logprobs[1].astype(np.float64)) - p(b.raw_logprobs[1].astype(np.float64))).max()
    assert compare(a, b, COLS)["p_max"] == pytest.approx(want, rel=1e-9)


def test_near_ties_are_counted_apart_from_flips():
    a = result(0)
    a.raw_logprobs[0, :4] = np.log([0.40, 0.38, 0.12, 0.10])  # a near-tie: top two 0.02 apart
    a.raw_logprobs[1, :4] = np.log([0.70, 0.10, 0.10, 0.10])  # a clear winner
    b = copy_of(a)
    b.raw_logprobs[0, :2] = np.log([0.38, 0.40])  # the tie flips: rounding, not a disagreement
    m = compare(a, b, COLS)
    assert m["argmax"] == 1.0 and m["tie_flips"] == 1 and m["ties"] >= 1
    b.raw_logprobs[1, :2] = np.log([0.10, 0.70])  # a clear winner flips: counted against argmax
    m = compare(a, b, COLS)
    n_clear = len(COLS) - m["ties"]
    assert m["argmax"] == pytest.approx(1 - 1 / n_clear) and m["tie_flips"] == 1
    assert compare(a, b, COLS, tie_gap=0.0)["ties"] == 0  # no near-ties at gap 0: every flip counts


def test_noise_beyond_tolerance_fails_with_named_metrics():
    a = result(0)
    m = compare(a, result(1, 0.05, a), COLS)
    bad = violations(m, FP32)
    assert any(b.startswith("lp_max") for b in bad) and any(b.startswith("nll_max") for b in bad)
    loose = {"p_max": 1, "p_mean": 1, "lp_max": 1, "argmax": 0, "cos_min": 0, "nll_max": 1}
    assert violations(m, loose) == []
    b = copy_of(a)
    b.n_tokens[0] += 1
    assert "different tokenization" in violations(compare(a, b, COLS), FP32)[-1]
    table = format_table([{"name": "vllm vs hf", "n": 6, "metrics": m, "violations": bad}])
    assert "vllm vs hf" in table and "FAIL: p_max" in table


def test_reduced_precision_tolerances_scale_the_measured_noise():
    noise = {"p_max": 0.1, "p_mean": 0.01, "lp_max": 0.5, "argmax": 0.95, "cos_min": 0.999, "nll_max": 1e-4}
    tol = noise_tolerances(noise, FP32, factor=2.0)
    assert tol["p_max"] == pytest.approx(0.2) and tol["p_mean"] == pytest.approx(0.02)
    assert tol["lp_max"] == pytest.approx(1.0) and tol["argmax"] == pytest.approx(0.9)
    assert tol["cos_min"] == pytest.approx(0.998)
    assert tol["nll_max"] == FP32["nll_max"]  # 2 x 1e-4 is below the float32 floor
    assert noise_tolerances(dict.fromkeys(noise, 0.0) | {"argmax": 1.0, "cos_min": 1.0}, FP32) == FP32
    other = noise | {"p_max": 0.3, "argmax": 0.99, "cos_min": 0.99}
    assert worst([noise, other]) == noise | {"p_max": 0.3, "cos_min": 0.99}  # largest Δ, lowest agreement


@dataclass
class Prompt:
    text: str
    options: tuple[str, ...]


class ShiftedNLL(HFBackend):
    """A backend with an NLL bug (off by 0.2 nats): what the vllm row must catch."""

    def score(self, prompts, token_ids, progress=None):
        res = super().score(prompts, token_ids, progress)
        return ScoreResult(res.raw_logprobs, res.hidden, res.prompt_nll + 0.2, res.n_tokens)


def test_bf16_check_end_to_end_on_the_tiny_model(monkeypatch):
    """bf16: hf batch=1 must be bit-identical, hf padded and hf float32 are the run's own noise, and a second
    backend is judged against 2x that noise: a backend = hf padded passes, one with an NLL bug fails naming
    nll_max."""
    tok = tiny_tokenizer()
    model32 = tiny_model(len(tok))
    model = copy.deepcopy(model32).to(torch.bfloat16)
    long = [" ".join(PROMPTS[i:] + PROMPTS[:i]) for i in range(5)]  # ~90 tokens: SDPA blocks by key length
    prompts = [Prompt(p, ("A", "B", "C")) for p in long + PROMPTS]
    second = {"vllm": lambda: HFBackend(model, tok, batch_tokens=400, batch_invariant=False)}
    opened: list[tuple] = []

    def fake_load(cfg):
        """What open_for would load for a row's config: its mode is in its settled hf options alone."""
        opened.append((cfg.backend, cfg.dtype, cfg.device, cfg.backend_args))
        if cfg.backend == "hf":
            args = backend_options("hf", cfg.backend_args)  # the one validator, as settle reads them
            return HFBackend(
                model if cfg.dtype == "bfloat16" else model32,
                tok,
                batch_tokens=400,
                max_batch_rows=args.max_batch_rows or None,
                batch_invariant=None if args.batch_invariant == "auto" else args.batch_invariant != "off",
            )
        assert cfg.dtype == "bfloat16"
        return second["vllm"]()

    monkeypatch.setattr(check_mod, "render_prompts", lambda cfg: prompts)
    monkeypatch.setattr(check_mod, "load_backend", fake_load)
    cfg = ExtractConfig(model="smollm2-135m", dataset="arc-challenge", dtype="bfloat16", progress=False)
    res = run_check(cfg, ["hf", "vllm"], out=lambda s: None)
    # every row opens its own backend with its mode as settled options; none is changed once loaded
    assert opened == [
        ("hf", "bfloat16", "cpu", {}),
        ("hf", "bfloat16", "cpu", {"max_batch_rows": 1}),
        ("hf", "bfloat16", "cpu", {"batch_invariant": "off"}),
        ("hf", "float32", "cpu", {}),
        ("vllm", "bfloat16", "cpu", {}),
    ]
    rows = {r["name"]: r for r in res["rows"]}
    assert res["batch_invariant"] is True and res["passed"], format_table(res["rows"])
    several = hf_packed.linear_rows_invariant(model, 400)[0]  # a property of this machine's GEMM kernels
    assert res["hf_packs"] == ("several prompts each" if several else "one prompt each")
    assert rows["hf batch=1 vs hf"]["verdict"] == "bit-identical"
    padded, fp32 = rows["hf padded vs hf"]["metrics"], rows["hf float32 vs hf"]["metrics"]
    assert rows["hf padded vs hf"]["verdict"] == rows["hf float32 vs hf"]["verdict"] == "noise (no verdict)"
    assert padded["identical"] is False and fp32["lp_max"] > padded["lp_max"]  # bf16's own rounding is larger
    for key in ("lp_max", "nll_max"):
        want = max(2 * padded[key], 2 * fp32[key], TOLERANCES["float32"][key])
        assert res["tolerances"][key] == pytest.approx(want)
    second["vllm"] = lambda: ShiftedNLL(model, tok, batch_tokens=400, batch_invariant=False)
    res = run_check(cfg, ["hf", "vllm"], out=lambda s: None)
    assert not res["passed"] and res["rows"][-1]["violations"][0].startswith("nll_max 0.2")


def test_cli_defaults_to_float32_and_errors_are_one_line(monkeypatch):
    seen = {}

    def fake_run_check(cfg, names, out, tie_gap):
        seen.update(dtype=cfg.dtype, tie_gap=tie_gap)
        raise ValueError("stop here")

    monkeypatch.setattr(check_mod, "run_check", fake_run_check)
    res = CliRunner().invoke(app, ["--model", "smollm2-135m", "--dataset", "arc-challenge"])
    assert res.exit_code == 1 and seen == {"dtype": "float32", "tie_gap": 0.05}
    res = CliRunner().invoke(
        app, ["--model", "smollm2-135m", "--dataset", "arc-challenge", "--backends", "hf,tgi"]
    )
    assert res.exit_code == 2 and "unknown tgi" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(app, ["--model", "m", "--dataset", "d", "--tie-gap", "1.5"])
    assert res.exit_code == 2 and "--tie-gap must be in [0, 1), got 1.5" in res.output
    monkeypatch.undo()
    res = CliRunner().invoke(app, ["--model", "nope", "--dataset", "arc-challenge"])
    assert res.exit_code == 2 and "no such model" in res.output.lower()
    (gap,) = [p for p in typer.main.get_command(app).params if p.name == "tie_gap"]
    assert f"default: {TIE_GAP})" in gap.help  # the help states the recipe's default
