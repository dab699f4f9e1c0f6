"""What the installed torch can run, read from its distribution's metadata instead of importing it (2-12 s on
this CPU): a `--device cuda` that a CPU-only build can never give is a usage error answered at once.

    refuse_cuda_early("train", cfg.device)   # walla train: error: --device cuda: this torch (2.13.0+cpu) ...

A CUDA build on a machine without a usable GPU still needs torch to tell (extract/device.py check_device).
"""

from __future__ import annotations

import importlib.metadata

from walla.cli.exits import USAGE, fail


def cpu_only_torch() -> str | None:
    """The installed torch's version when it is a CPU-only build (a `+cpu` local version), else None."""
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None
    return version if version.endswith("+cpu") else None


def refuse_cuda_early(sub: str, device: str | None) -> None:
    """Exit 2 with one line when `device` asks for CUDA and the installed torch is a CPU-only build."""
    version = cpu_only_torch() if device and device.strip().lower().startswith("cuda") else None
    if version:
        raise fail(
            sub,
            f"--device {device}: no CUDA GPU is usable on this machine (torch {version}, built without CUDA); "
            "use --device cpu",
            USAGE,
        )
