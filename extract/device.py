"""Checking `--device` before anything is loaded: a device this machine cannot use is one line, not a traceback."""

from __future__ import annotations

import torch


def check_device(device: str, backend: str) -> None:
    """A device this machine cannot use is one line, before any data or model is loaded.

    Raises:
        ValueError: unknown device name, or CUDA / MPS not available here.
    """
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda", "mps") or (index and (kind != "cuda" or not index.isdigit())):
        raise ValueError(f"--device must be cpu, cuda, cuda:N or mps, got {device!r}")
    if backend == "dummy" or kind == "cpu":
        return
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ValueError("--device mps: MPS is not available on this machine; use --device cpu")
    if kind == "cuda" and not torch.cuda.is_available():
        built = "built with" if torch.backends.cuda.is_built() else "built without"
        raise ValueError(
            f"--device {device}: no CUDA GPU is usable on this machine (torch {torch.__version__}, {built} CUDA); "
            "use --device cpu"
        )
    if kind == "cuda" and index and int(index) >= torch.cuda.device_count():
        raise ValueError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
