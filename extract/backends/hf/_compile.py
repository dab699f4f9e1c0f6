"""torch.compile for the hf backend: regional compilation of the decoder layers, and when `--compile auto`
turns it on.

Why regional: every layer of one class shares one compiled graph, so the one-time cost is one layer's
compile (measured on the 2-core CPU: ~10-40 s cold, a few s with inductor's on-disk cache warm), not the
whole model's (a full-model compile with freezing took ~90 s there).

Across runs the compiled code is reused from torch's on-disk caches (AOT autograd and FX graph caches, on by
default in torch 2.11 and 2.13, and Triton's kernels, which inductor keeps under the same folder), which
`compile_cache_dir` keeps per model identity, dtype, device kind, machine and torch version under
`$WALLA_CACHE/compile/<key>/`: a cache never serves another model or dtype, and deleting a folder only costs
that model one cold compile. A TORCHINDUCTOR_CACHE_DIR the user set is left alone. `compile_layers`' caller
reads `cache_counts` before and after to say whether a compile was served from the cache (the load line's
`compile (cached)`). Measured on the 2-core CPU, SmolLM2-135M float32: 23.3 s cold, 5.5 s from the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from walla.extract import dtype_probe

CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
_ours: set[str] = set()  # the folders use_compile_cache put into CACHE_ENV in this process


def user_cache_dir() -> str | None:
    """The TORCHINDUCTOR_CACHE_DIR the user chose, or None.

    Importing torch._dynamo (transformers does, at model load) writes torch's default folder into the
    environment (torch._dynamo.package, torch 2.11 and 2.13), so a value read there is the user's only when
    it is neither that default nor a folder walla set.
    """
    value = os.environ.get(CACHE_ENV)
    if value is None or value in _ours:
        return None
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return None if os.path.abspath(value) == os.path.abspath(default_cache_dir()) else value


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
    if user_cache_dir() is not None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    if os.environ.get(CACHE_ENV) != str(folder):
        os.environ[CACHE_ENV] = str(folder)  # read by inductor at each compile (cache_dir())
        _ours.add(str(folder))
        from torch._inductor.utils import clear_caches

        clear_caches()  # paths inductor memoized under the previous folder (CacheBase.get_local_cache_path)
    return folder


def cache_counts() -> dict[str, int]:
    """torch's compile-cache counters of this process so far: FX graph and AOT autograd hits and misses."""
    from torch._dynamo.utils import counters

    names = {
        "inductor": ("fxgraph_cache_hit", "fxgraph_cache_miss"),
        "aot_autograd": ("autograd_cache_hit", "autograd_cache_miss"),
    }
    return {n: int(counters[group][n]) for group, keys in names.items() for n in keys}


def served_from_cache(before: dict[str, int], after: dict[str, int]) -> bool:
    """Whether the compiles between two `cache_counts` were served from the on-disk cache: at least one hit,
    and inductor compiled no graph afresh."""
    d = {k: after[k] - before.get(k, 0) for k in after}
    return d["fxgraph_cache_hit"] + d["autograd_cache_hit"] > 0 and d["fxgraph_cache_miss"] == 0


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
COMPILE_MIN_TOKENS_CUDA = 1_000_000  # ... and on a CUDA device (see explain_compile)


def compile_threshold(device: str) -> tuple[int, str]:
    """(prompt tokens from which `--compile auto` compiles on `device`, the evidence for it)."""
    if device.startswith("cuda"):
        return COMPILE_MIN_TOKENS_CUDA, (
            "on an H100 the compile took 14.9 s, 5.3 s from its cache, and saved ~1-2 s of a 213k-token 8B job "
            "(compiled 1.15-1.24x the eager forward): it pays back from ~1M tokens"
        )
    return COMPILE_MIN_TOKENS, "a one-time compile of ~10-40 s pays back from there on a CPU"


def explain_compile(mode: str, est_tokens: int, device: str) -> tuple[bool, str]:
    """(compile?, why) for --compile auto|on|off and a job of ~`est_tokens` prompt tokens.

    auto: on from `compile_threshold(device)` tokens. CPU: measured on the 2-core CPU
    (benchmarks/extract_throughput.py), the compiled forward is ~1.3-1.6x faster, the compile costs ~10-40 s
    once per process, so below ~300k tokens (~2-3 minutes of eager extraction there) it does not pay back.
    CUDA: the compiled forward ran 1.15-1.24x the eager one on an H100 (issue 22: 1.04x vs 0.84x a bare loop at
    the 1B shape, 1.10x vs 0.96x at 8B), but the compile is paid by every run: measured there (issue 31, 8B
    shape, bf16) 14.9 s with cold caches and 5.3 s served from them, where a 213k-token job's extraction took
    6.5 s compiled, so the compile saved ~1-2 s and cost 5.3-14.9; at ~1M tokens the saving covers a cached
    compile. The load line prints what it cost (`compile N s`); `--backend-arg compile=on|off` decides.
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
