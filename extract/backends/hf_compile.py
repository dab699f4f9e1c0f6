"""torch.compile for the hf backend: regional compilation of the decoder layers, and when `--compile auto`
turns it on.

Why regional: every layer of one class shares one compiled graph, so the one-time cost is one layer's
compile (measured on the 2-core CPU: ~10-40 s cold, a few s with inductor's on-disk cache warm), not the
whole model's (a full-model compile with freezing took ~90 s there).

Across runs the compiled code is reused from inductor's on-disk caches (FX graphs, kernels), which
`compile_cache_dir` keeps per model identity, dtype, device kind, machine and torch version under
`$WALLA_CACHE/compile/<key>/`: a cache never serves another model or dtype, and deleting a folder only costs
that model one cold compile. A TORCHINDUCTOR_CACHE_DIR the user set is left alone.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from walla.extract import dtype_probe

_USER_CACHE_DIR = os.environ.get("TORCHINDUCTOR_CACHE_DIR")  # set before walla ran: the user's choice


def compile_cache_dir(model_identity: dict, dtype: str, device: str, root: Path) -> Path:
    """The inductor cache folder of one model identity (the fingerprint's), dtype, device kind, machine and
    torch version, under `root`."""
    key = {
        "model": model_identity,
        "dtype": str(dtype).removeprefix("torch."),
        "device": dtype_probe.machine_key(device),
        "torch": torch.__version__,
    }
    text = json.dumps(key, sort_keys=True, default=str)
    return root / "compile" / hashlib.sha256(text.encode()).hexdigest()[:16]


def use_compile_cache(folder: Path) -> Path | None:
    """Point inductor's on-disk caches at `folder` for the compiles that follow (kept until the next call);
    returns the folder in use, or None where the user set TORCHINDUCTOR_CACHE_DIR (theirs is used)."""
    if _USER_CACHE_DIR is not None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)  # read by inductor at each compile
    return folder


def compile_layers(model) -> None:
    """Regional compilation: every decoder layer through torch.compile with dynamic shapes (batches differ
    in rows and length, so one graph serves them all instead of one recompile per shape)."""
    layers = getattr(model.get_decoder(), "layers", None)
    if layers is None:
        raise ValueError(f"--compile on: {type(model).__name__} has no decoder.layers to compile")
    for layer in layers:
        layer.compile(dynamic=True)


COMPILE_MODES = ("auto", "on", "off")
COMPILE_MIN_TOKENS = 300_000  # `--compile auto` compiles from this many prompt tokens on a CPU
COMPILE_MIN_TOKENS_CUDA = 100_000  # ... and on a CUDA device (see explain_compile)


def compile_threshold(device: str) -> tuple[int, str]:
    """(prompt tokens from which `--compile auto` compiles on `device`, the evidence for it)."""
    if device.startswith("cuda"):
        return COMPILE_MIN_TOKENS_CUDA, (
            "on an H100 the compiled forward ran 1.15-1.24x the eager one on jobs of 200k-500k tokens "
            "(issue 22; the one-time compile was not timed on a GPU)"
        )
    return COMPILE_MIN_TOKENS, "a one-time compile of ~10-40 s pays back from there on a CPU"


def explain_compile(mode: str, est_tokens: int, device: str) -> tuple[bool, str]:
    """(compile?, why) for --compile auto|on|off and a job of ~`est_tokens` prompt tokens.

    auto: on from `compile_threshold(device)` tokens. CPU: measured on the 2-core CPU
    (benchmarks/extract_throughput.py), the compiled forward is ~1.3-1.6x faster, the compile costs ~10-40 s
    once per process, so below ~300k tokens (~2-3 minutes of eager extraction there) it does not pay back.
    CUDA: the GPU runs the same job 10-50x faster, so the eager overhead inductor removes (norms, RoPE,
    activations, residuals: many small kernels per layer) is a larger share of it; the issue's H100 table
    measured 1.04x vs 0.84x a bare loop (1B shape) and 1.10x vs 0.96x (8B). What the compile itself costs on a
    GPU host was not measured here: the load line prints it (`compile N s`), and `--compile off` avoids it.
    """
    if mode in ("on", "off"):
        return mode == "on", f"compile {mode} [--backend-arg compile]"
    if mode not in COMPILE_MODES:
        raise ValueError(f"--backend-arg compile must be auto, on or off, got {mode!r}")
    threshold, evidence = compile_threshold(device)
    on = est_tokens >= threshold
    rel = ">=" if on else "<"
    return on, (
        f"compile auto -> {'on' if on else 'off'}: ~{est_tokens:,} prompt tokens {rel} {threshold:,} "
        f"on {device} ({evidence})"
    )
