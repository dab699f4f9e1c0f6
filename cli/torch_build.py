"""What the installed torch can run, read without importing it (2-12 s on this CPU): a `--device cuda` that
this machine can never give is a usage error answered at once.

    refuse_cuda_early("train", cfg.device)   # walla train: error: --device cuda: this torch (2.13.0+cpu) ...

Two cases are told apart without torch: a CPU-only build (its `+cpu` local version, from the distribution's
metadata), and a CUDA build on a machine whose NVIDIA driver sees no GPU (NVML, which counts devices without
creating a CUDA context, so a later fork stays safe). Anything less certain is left to torch
(extract/device.py check_device).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.metadata
import os

from walla.cli.exits import USAGE, fail

NVML_LIBRARY = "libnvidia-ml.so.1"


def torch_version() -> str | None:
    """The installed torch's version string, or None when torch is not installed."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_only_torch() -> str | None:
    """The installed torch's version when it is a CPU-only build (a `+cpu` local version), else None."""
    version = torch_version()
    return version if version and version.endswith("+cpu") else None


def visible_nvidia_gpus(library: str = NVML_LIBRARY) -> int | None:
    """How many NVIDIA GPUs this process may use, or None when that cannot be told without torch.

    0 when CUDA_VISIBLE_DEVICES hides every device, when no NVIDIA driver is installed (NVML cannot be
    loaded), or when NVML counts no device. NVML ignores CUDA_VISIBLE_DEVICES, so a non-empty mask
    leaves the answer to torch (None) whenever a device exists.
    """
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    if mask is not None and mask.strip() in ("", "-1"):
        return 0
    try:
        nvml = ctypes.CDLL(library)
    except OSError:
        return 0
    try:
        if nvml.nvmlInit_v2() != 0:
            return None  # a driver without a usable NVML: let torch tell
        count = ctypes.c_uint(0)
        status = nvml.nvmlDeviceGetCount_v2(ctypes.byref(count))
        nvml.nvmlShutdown()
    except AttributeError:
        return None
    if status != 0:
        return None
    return 0 if count.value == 0 else (None if mask is not None else count.value)


def cuda_unusable(device: str | None) -> str | None:
    """Why CUDA `device` can never run on this machine, told without importing torch; None when it is not a
    CUDA device or when it may run (torch then tells)."""
    if not (device and device.strip().lower().startswith("cuda")):
        return None
    version = torch_version()
    if version is None:
        return None  # no torch at all: the stage's own import says so
    if version.endswith("+cpu"):
        return f"no CUDA GPU is usable on this machine (torch {version}, built without CUDA)"
    if "+rocm" in version:
        return None  # ROCm serves "cuda" through HIP: NVML does not count its devices
    if visible_nvidia_gpus() == 0:
        return (
            f"no CUDA GPU is usable on this machine (torch {version}; the NVIDIA driver sees no device, or "
            "CUDA_VISIBLE_DEVICES hides them all)"
        )
    return None


def refuse_cuda_early(sub: str, device: str | None) -> None:
    """Exit 2 with one line when `device` asks for CUDA and this machine surely cannot give it."""
    why = cuda_unusable(device)
    if why:
        raise fail(sub, f"--device {device}: {why}; use --device cpu", USAGE)


def device_argument(device: str) -> str:
    """An argparse `type=` for --device (the benchmarks): a CUDA device this machine can never give is refused
    as a usage error, in one line, before torch loads."""
    why = cuda_unusable(device)
    if why:
        raise argparse.ArgumentTypeError(f"{device}: {why}")
    return device
