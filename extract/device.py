"""Checking `--device` before anything is loaded: a device this machine cannot use is one line, not a traceback."""

from __future__ import annotations

import importlib.metadata
import os
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


# environment variables that cap or steer which CPU kernels run (oneDNN: the bf16/fp16 GEMMs; MKL: float32 GEMMs);
# ATen's own cap (ATEN_CPU_CAPABILITY) shows in torch.backends.cpu.get_cpu_capability()
KERNEL_ENV = (
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "ONEDNN_CPU_ISA_HINTS",
    "DNNL_CPU_ISA_HINTS",
    "MKL_ENABLE_INSTRUCTIONS",
    "MKL_CBWR",
)
# CPU features a reduced-precision kernel path depends on (x86 flags and arm Features, as /proc/cpuinfo spells them)
KERNEL_FEATURES = (
    "avx2",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_fp16",
    "asimd",
    "sve",
    "sve2",
    "bf16",
    "i8mm",
)


def cpu_flags() -> set[str]:
    """The CPU's feature flags (the first processor of /proc/cpuinfo), else what torch's cpuinfo reports."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("flags", "Features"):
                return set(value.split())
    except OSError:
        pass
    probes = {
        "avx2": "_is_avx2_supported",
        "avx512f": "_is_avx512_supported",
        "avx512_vnni": "_is_vnni_supported",
        "avx512_bf16": "_is_avx512_bf16_supported",
        "amx_tile": "_is_amx_tile_supported",
        "amx_fp16": "_is_amx_fp16_supported",
    }
    return {flag for flag, fn in probes.items() if getattr(torch.cpu, fn, lambda: False)()}


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def kernel_identity(device: str) -> dict:
    """Which kernel path computes on `device`: recorded in the fingerprint of every feature set whose numbers are
    promised finer than a tolerance (hf/kind.py: bitwise and batch-recorded sets), because the same dtype on the
    same library versions computes other bits on another path (issue 37: bf16 on SmolLM2-135M, AVX512-bf16 vs
    oneDNN capped at AVX2: option log-probs up to 0.197 apart, 0 of 80 rows equal).

    - CPU: ATen's vector ISA (`torch.backends.cpu.get_cpu_capability()`, capped by ATEN_CPU_CAPABILITY: its
      softmax, norms and elementwise kernels), the CPU features the bf16/fp16 GEMMs use (AVX512-bf16, AMX, ...:
      oneDNN dispatches on them), every KERNEL_ENV variable set (ONEDNN_MAX_CPU_ISA caps what oneDNN uses) and
      whether oneDNN is on. What oneDNN runs is the best of `features` that `isa_env` allows.
    - CUDA: the GPU's name and compute capability, and the CUDA, cuDNN and cuBLAS versions (torch's own is
      recorded beside this in every identity).
    - MPS: the chip.
    """
    kind = check_device_name(device)
    if kind == "cuda":
        if not torch.cuda.is_available():
            return {"gpu": "unknown (CUDA is not visible to this process)"}
        index = torch.device(device).index or 0
        major, minor = torch.cuda.get_device_capability(index)
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        return {
            "gpu": torch.cuda.get_device_name(index),
            "capability": f"{major}.{minor}",
            "cuda": torch.version.cuda,
            "cudnn": cudnn,
            "cublas": _version("nvidia-cublas-cu12") or _version("nvidia-cublas"),
        }
    if kind == "mps":
        return {"chip": accelerator(device)}
    flags = cpu_flags()
    return {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "features": [f for f in KERNEL_FEATURES if f in flags],
        "isa_env": {k: os.environ[k] for k in KERNEL_ENV if os.environ.get(k)},
        "onednn": bool(torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled),
    }
