"""What the hf backend will compute, known before any weights load: the dtype, whether scoring is
batch-invariant and on which path, and the fingerprint inputs (`hf_identity`) that follow from them.

extract/backends/hf/_kind.py settles a run's options with these (so complete feature sets are skipped at once);
extract/backends/hf/_backend.py scores as they decided. Why each mode is the default where it is: the module docstring
of extract/backends/hf/_backend.py (batch composition).
"""

from __future__ import annotations

import torch
import transformers
from walla.extract import dtype_probe
from walla.extract.backends import BATCHING_KEY
from walla.extract.backends.hf import _fixed as hf_fixed

DTYPES = dtype_probe.DTYPES


def resolve_dtype(name: str, device: str) -> torch.dtype:
    """`auto`: the dtype this machine runs GEMMs fastest, measured once per machine (extract/dtype_probe.py)."""
    return DTYPES[explain_dtype(name, device)[0]]


def explain_dtype(name: str, device: str) -> tuple[str, str]:
    """(dtype name, why) for a --dtype value; `auto` is measured on `device` and cached under $WALLA_CACHE."""
    return dtype_probe.resolve(name, device, dtype_probe.default_cache_dir())


BATCH_INVARIANT_MODES = ("auto", "on", "off", "fixed")
# version of the batch-invariant scoring's numerics, in the fingerprint of every invariant feature set: 2 = one
# blocked attention call per layer, shared prefix cached, LM head over the pack, NLL by fsum (1, unrecorded:
# per-prompt SDPA, per-prompt LM head). Bump it whenever invariant scoring computes other bits.
INVARIANT_SCORING = 2
# how rows are grouped into forward passes (recorded with the sizes where outputs depend on it)
BATCH_ORDER = "score calls of shard_rows rows (cut at multiples of it), each sorted longest first"


# `batch_invariant=auto` on CUDA in reduced precision: the fixed-shape path (hf/fixed.py) when True, padded
# batches when False. The one switch for the CUDA default (issue 31: on if it costs <= 1.3x the padded run).
# Measured on an H100 (random Llama shapes, ARC prompts, bf16, compile on, extraction as printed): fixed-v1
# 9.20 s vs padded 6.50 s = 1.42x (8B, 213k tokens); fixed-v2 6.40 s vs 6.50 s = 0.98x (8B, best of 2);
# fixed-v3 0.90 s vs 1.00 s = 0.90x (1B, 107k tokens, one run each). `--backend-arg batch_invariant=off`: padded.
CUDA_INVARIANT_BY_DEFAULT = True


def invariant_by_default(dtype: torch.dtype, device: str = "cpu") -> bool:
    """`batch_invariant=auto`: on in reduced precision on a CPU, where batch composition moves results
    visibly and packing costs little; on CUDA as CUDA_INVARIANT_BY_DEFAULT says (fixed shapes); off in
    float32."""
    if dtype == torch.float32:
        return False
    return CUDA_INVARIANT_BY_DEFAULT or not str(device).startswith("cuda")


def invariant_path(mode: str, device: str) -> str:
    """Which batch-invariant path a mode runs on `device`: `fixed` (hf/fixed.py: fixed shapes, for kernels that
    pick by row count: CUDA) or `packed` (hf/packed.py: a packed stream, for row-invariant GEMMs: the CPU).
    `batch_invariant=fixed` forces the fixed-shape path on any device."""
    return "fixed" if mode == "fixed" or str(device).startswith("cuda") else "packed"


def explain_batch_invariant(mode: str, dtype: torch.dtype, device: str) -> tuple[bool, str]:
    """(batch-invariant scoring?, why) for --backend-arg batch_invariant=auto|on|off|fixed, a dtype and a
    device (which path: `invariant_path`)."""
    if mode in ("on", "off", "fixed"):
        on = mode != "off"
        path = f" ({invariant_path(mode, device)} path)" if on else ""
        return on, f"batch-invariant {mode}{path} [--backend-arg batch_invariant]"
    if mode != "auto":
        raise ValueError(f"--backend-arg batch_invariant must be auto, on, off or fixed, got {mode!r}")
    on = invariant_by_default(dtype, device)
    if dtype == torch.float32:
        why = "float32: padded batches (batch composition moves results by ~1e-5 there)"
    elif on and invariant_path(mode, device) == "fixed":
        why = (
            f"fixed-shape packs of {hf_fixed.PACK_TOKENS} tokens on {device} (hf/fixed.py: every kernel sees one "
            "shape, so cuBLAS cannot pick another by row count): a prompt's numbers do not depend on its batch"
        )
    elif on:
        why = (
            f"packed prompts, attention and LM head per prompt on {device}: a prompt's numbers do not depend "
            "on its batch"
        )
    else:
        why = (
            f"padded batches on {device}, as a bare loop runs them (packed scoring runs attention prompt by "
            "prompt, and one prompt per pass where cuBLAS picks kernels by row count); outputs then depend on "
            "the batch composition, so the fingerprint records batch tokens, shard rows and order"
        )
    return on, f"batch-invariant auto -> {'on' if on else 'off'}: {why}"


def batching_identity(dtype: torch.dtype, invariant: bool, batch_tokens: int, shard_rows: int) -> dict | None:
    """What fixes the batch composition, where it changes the outputs (reduced precision, not invariant)."""
    if invariant or dtype == torch.float32:
        return None
    return {"batch_tokens": int(batch_tokens), "shard_rows": int(shard_rows), "order": BATCH_ORDER}


def hf_identity(
    dtype: torch.dtype,
    chat_template: bool,
    compiled: bool = False,
    batch_invariant: bool | None = None,
    batching: dict | None = None,
    fixed: dict | None = None,
) -> dict:
    """Fingerprint inputs of this backend (known before loading, so complete sets are skipped at once).

    A compiled forward rounds differently (fused ops keep fp32 between them), so it is recorded; so is
    batch-invariant scoring (other numbers than padded batches in reduced precision), and, in reduced
    precision without it, the batching that fixes which prompts share a pass (with invariant scoring, the
    version of its numerics, INVARIANT_SCORING; on the fixed-shape path, `fixed`: hf_fixed.fixed_identity(),
    with hf_fixed.FIXED_SCORING as the version). Each key is absent when off,
    so feature sets extracted before the option existed keep their fingerprint.
    """
    invariant = invariant_by_default(dtype) if batch_invariant is None else batch_invariant
    scoring = {"invariant_scoring": INVARIANT_SCORING}
    if fixed is not None:
        scoring = {"invariant_scoring": hf_fixed.FIXED_SCORING, "fixed_shapes": fixed}
    return {
        **({"compile": True} if compiled else {}),
        **({"batch_invariant": True, **scoring} if invariant else {}),
        **({BATCHING_KEY: batching} if batching else {}),
        "backend": "hf",
        "transformers": transformers.__version__,
        "torch": torch.__version__.split("+")[0],
        "dtype": str(dtype).removeprefix("torch."),
        "chat_template": bool(chat_template),
        "nll": "real-tokens",
    }  # prompt NLL over real tokens only (not the reference's pad/BOS quirk)
