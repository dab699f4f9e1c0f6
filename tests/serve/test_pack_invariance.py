"""Bitwise for every pack (issue 48, item 2): on a `bitwise` feature set a served prompt's numbers do not
depend on how many prompts share its scoring pass. The regression case is the demo's facts-00320 with its
fact, scored by Gemma-3-270M in bfloat16 (130 tokens), alone and in packs of 2, 8, 32 and 64 prompts through
extract/scoring.py score_prompts, as the batcher packs them.

The red team saw its hidden state move alone and with 31 or 63 others (581 of 640 values, max 0.625) while
packs of 2 and 8 matched the store, on a CPU with native bfloat16 GEMMs. On an AVX2-only CPU (this project's
CI) bfloat16 GEMMs are emulated (about 1 GFLOP/s): the real-model case would take about an hour there and
uses other kernels, so it runs only where the CPU has native bfloat16 (avx512_bf16 or amx_bf16); the same
property is tested everywhere on the tiny bfloat16 pool of the serve tests (packed scoring, tier bitwise),
with a prompt as long as the regression case's."""

from __future__ import annotations

import numpy as np
import pytest

PACKS = (1, 2, 8, 32, 64)
OPTIONS = ["Yes", "No"]


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (where the red team's fault showed)."""
    try:
        flags = open("/proc/cpuinfo", encoding="utf-8").read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def assert_same_bits_in_every_pack(backend, target: str, others: list[str]) -> None:
    """`target` scored (extract/scoring.py score_prompts) first in packs of PACKS sizes, filled from `others`."""
    from walla.extract.scoring import score_prompts

    strings = [" Yes", " No"]
    seen = {}
    for n in PACKS:
        (probs, hidden, _), *_ = score_prompts(
            backend, [(target, strings)] + [(p, strings) for p in others[: n - 1]]
        )
        seen[n] = (probs, hidden)
    assert_same_bits(seen)


def assert_same_bits(seen: dict) -> None:
    probs1, hidden1 = seen[1]
    for n in PACKS[1:]:
        probs, hidden = seen[n]
        moved = int((hidden != hidden1).sum())
        assert moved == 0, f"pack of {n}: {moved} of {hidden.size} hidden values differ from the prompt alone"
        assert np.array_equal(probs, probs1), f"pack of {n}: probabilities differ from the prompt alone"


def test_a_long_prompt_is_the_same_bits_in_every_pack_size_on_the_tiny_bf16_pool(served_pool):

    agent = served_pool.agents[0]
    backend = agent.llm.backend
    assert agent.llm.tier == "bitwise"
    target = backend.format_prompt(
        "Box 6 holds keys, box 7 holds a red ball. " * 12 + "Does box 6 hold keys?"
    )
    assert len(backend.encode(target)) >= 130  # as long as the regression case
    others = [
        backend.format_prompt(f"Box {i} holds item {i % 7}. Does box {i} hold it?" * (1 + i % 5))
        for i in range(63)
    ]
    assert_same_bits_in_every_pack(backend, target, others)


@pytest.mark.slow
@pytest.mark.skipif(not native_bf16(), reason="native bfloat16 CPUs only (module docstring)")
def test_a_prompt_is_the_same_bits_in_every_pack_size():
    from walla.extract.config import ExtractConfig
    from walla.extract.datasets.facts import generate
    from walla.extract.door import open_for
    from walla.extract.prompts import get_template, render

    settled, backend = open_for(ExtractConfig(model="gemma3-270m", dataset="facts", dtype="bfloat16"))
    try:
        if settled.identity.get("determinism") != "bitwise":
            pytest.skip(f"gemma3-270m in bfloat16 is tier {settled.identity.get('determinism')} here")
        rows, template = generate(400, 7), get_template("facts")  # the demo's 400 questions

        def prompt(row: dict, with_fact: bool) -> str:
            body = render(template, row["question"], OPTIONS, row["context"] if with_fact else None)
            return backend.format_prompt(body)

        target = prompt(rows[320], True)  # facts-00320 with its fact: the regression case
        others = [prompt(r, i % 2 == 0) for i, r in enumerate(rows[:80]) if i != 320]
        assert_same_bits_in_every_pack(backend, target, others)
    finally:
        backend.close()
