"""Bitwise for every pack (issue 48, item 2): on a `bitwise` feature set a served prompt's numbers do not
depend on how many prompts share its scoring pass. The regression case is the demo's facts-00320 with its
fact, scored by Gemma-3-270M in bfloat16 (130 tokens), alone and in packs of 2, 8, 32 and 64 prompts through
serve/features.py score_prompts, as the batcher packs them.

Not fixed yet: the red team saw its hidden state move alone and with 31 or 63 others (581 of 640 values,
max 0.625) while packs of 2 and 8 matched the store; the kernel choice that depends on the pack was not found
in this session (loading Gemma-3 in bf16 with its invariance probes took over 25 minutes on the loaded
2-core machine). Until it is, this test is expected to fail where the fault shows."""

from __future__ import annotations

import numpy as np
import pytest

PACKS = (1, 2, 8, 32, 64)
OPTIONS = ["Yes", "No"]


@pytest.mark.slow
@pytest.mark.xfail(reason="issue 48 item 2: the pack-size-dependent kernel is not fixed yet", strict=False)
def test_a_prompt_is_the_same_bits_in_every_pack_size():
    from walla.extract.config import ExtractConfig
    from walla.extract.datasets.facts import generate
    from walla.extract.door import open_for
    from walla.extract.prompts import get_template, render
    from walla.serve.features import score_prompts

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
        strings = [" Yes", " No"]
        seen = {}
        for n in PACKS:
            (probs, hidden, _), *_ = score_prompts(
                backend, [(target, strings)] + [(p, strings) for p in others[: n - 1]]
            )
            seen[n] = (probs, hidden)
        probs1, hidden1 = seen[1]
        for n in PACKS[1:]:
            probs, hidden = seen[n]
            moved = int((hidden != hidden1).sum())
            assert moved == 0, (
                f"pack of {n}: {moved} of {hidden.size} hidden values differ from the prompt alone"
            )
            assert np.array_equal(probs, probs1), f"pack of {n}: probabilities differ from the prompt alone"
    finally:
        backend.close()
