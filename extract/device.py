"""Checking `--device` before anything is loaded: a device this machine cannot use is one line, not a traceback."""

from __future__ import annotations

import torch


def default_device() -> str:
    """cuda when a GPU is usable, else cpu."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def check_device_name(device: str) -> str:
    """The device's kind (cpu, cuda or mps) of a well-formed --device value.

    Raises:
        ValueError: not cpu, cuda, cuda:N or mps.
    """
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda", "mps") or (index and (kind != "cuda" or not index.isdigit())):
        raise ValueError(f"--device must be cpu, cuda, cuda:N or mps, got {device!r}")
    return kind


def check_device(device: str) -> None:
    """A device this machine cannot use is one line, before any data or model is loaded.

    Raises:
        ValueError: unknown device name, or CUDA / MPS not available here.
    """
    kind = check_device_name(device)
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ValueError("--device mps: MPS is not available on this machine; use --device cpu")
    if kind == "cuda" and not torch.cuda.is_available():
        built = "built with" if torch.backends.cuda.is_built() else "built without"
        raise ValueError(
            f"--device {device}: no CUDA GPU is usable on this machine (torch {torch.__version__}, {built} CUDA); "
            "use --device cpu"
        )
    index = device.partition(":")[2]
    if kind == "cuda" and index and int(index) >= torch.cuda.device_count():
        raise ValueError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
