"""The load-time check of fixed-shape scoring (hf/fixed.py), cached per machine like hf_checks' probes.

Fixed shapes make every kernel see the same shapes, but whether a row's bits then depend on that row only is
a property of the kernels (a GEMM could still mix rows, e.g. a reduction across the batch): so random prompts
are scored alone, packed together and packed in reverse among another, through the model itself, and every
output must be the same bits. Cached per machine, dtype, model class and shape, attention implementation,
compiled or not, the fixed-shape constants and library versions, under `$WALLA_CACHE/hf-checks/`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from walla.extract.backends.hf import _fixed as hf_fixed
from walla.extract.backends.hf import _probes as hf_checks

# prompt lengths of the probe: a 1-token prompt, short ones, and each side of quantum and key-step edges
PROBE_LENGTHS = (1, 3, 15, 16, 17, 40, 127, 128, 129, 300)
OTHER_LENGTH = 50  # the prompt the second mix adds in front
FIELDS = ("option log-probs", "hidden state", "prompt NLL", "token count")


def fixed_invariant(backend, root: Path | None = None) -> tuple[bool, str]:
    """probe_fixed, once per machine, dtype, model shape, attention, constants and versions: (ok, why)."""
    key = {
        **hf_checks.model_probe_key(backend),
        "scoring": hf_fixed.FIXED_SCORING,
        "fixed": hf_fixed.fixed_identity(backend.device.type, backend.dtype, backend.pack_tokens),
        "lengths": list(PROBE_LENGTHS),
    }
    return hf_checks.cached_probe("fixed", key, root, lambda: probe_fixed(backend))


def first_difference(a, b) -> str | None:
    """The first field of two (option log-probs, hidden, NLL, n_tokens) rows whose bits differ, and by how much."""
    for name, x, y in zip(FIELDS, a, b, strict=True):
        x, y = np.asarray(x), np.asarray(y)
        if not np.array_equal(x, y):
            return f"{name} (max |diff| {float(np.abs(x.astype(np.float64) - y).max()):.3g})"
    return None


def rows_of(res, i: int) -> tuple:
    return res.raw_logprobs[i], res.hidden[i], res.prompt_nll[i], res.n_tokens[i]


@torch.inference_mode()
def probe_fixed(backend) -> tuple[bool, str]:
    """Random prompts (PROBE_LENGTHS tokens) alone, packed together and packed in reverse after another one,
    through hf_fixed on `backend`'s model: every output must be the same bits. Returns (ok, why)."""
    gen = torch.Generator().manual_seed(0)
    vocab = int(backend.head.weight.shape[0])
    prompts = [torch.randint(vocab, (n,), generator=gen).tolist() for n in PROBE_LENGTHS]
    other = torch.randint(vocab, (OTHER_LENGTH,), generator=gen).tolist()
    cand = list(range(min(8, vocab)))
    n = len(prompts)
    alone = hf_fixed.score(backend, prompts, cand, max_rows=1)
    together = hf_fixed.score(backend, prompts, cand)
    mixed = hf_fixed.score(backend, [other, *prompts[::-1]], cand)
    where = f"({backend.dtype}, {backend.device.type}, {hf_fixed.FIXED_SCORING}, {backend.pack_tokens} tokens a pack)"
    for name, res, at in (
        ("packed together", together, range(n)),
        ("in another mix", mixed, range(n, 0, -1)),
    ):
        for i, j in enumerate(at):
            diff = first_difference(rows_of(alone, i), rows_of(res, j))
            if diff is not None:
                return False, (
                    f"fixed shapes changed a {PROBE_LENGTHS[i]}-token prompt's {diff} {name} vs alone {where}: "
                    "each prompt runs alone in its own stream"
                )
    return True, (
        f"fixed shapes: prompts of {', '.join(map(str, PROBE_LENGTHS))} tokens gave the same bits alone and in "
        f"two mixes {where}"
    )
