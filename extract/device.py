"""Checking `--device` before anything is loaded: a device this machine cannot use is one line, not a traceback."""

from __future__ import annotations

import platform
from pathlib import Path

import torch
from walla.manifests.validate import UsageError


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
        raise UsageError(f"--device must be cpu, cuda, cuda:N or mps, got {device!r}")
    return kind


def check_device(device: str) -> None:
    """A device this machine cannot use is one line, before any data or model is loaded.

    Raises:
        ValueError: unknown device name, or CUDA / MPS not available here.
    """
    kind = check_device_name(device)
    if kind == "mps" and not torch.backends.mps.is_available():
        raise UsageError("--device mps: MPS is not available on this machine; use --device cpu")
    if kind == "cuda" and not torch.cuda.is_available():
        built = "built with" if torch.backends.cuda.is_built() else "built without"
        raise UsageError(
            f"--device {device}: no CUDA GPU is usable on this machine (torch {torch.__version__}, {built} CUDA); "
            "use --device cpu"
        )
    index = device.partition(":")[2]
    if kind == "cuda" and index and int(index) >= torch.cuda.device_count():
        raise UsageError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")


def accelerator(device: str) -> str:
    """The model of the chip whose kernels run on `device` (a GPU's name, the CPU's model name): recorded in a
    fingerprint where the numbers depend on which kernels ran (reduced precision, batch-dependent scoring)."""
    kind = check_device_name(device)
    if kind == "cuda":
        if not torch.cuda.is_available():
            return "unknown (CUDA is not visible to this process)"
        return torch.cuda.get_device_name(torch.device(device).index or 0)
    if kind == "mps":
        return f"Apple MPS ({platform.machine()})"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model"):
                return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine()
