"""`--dtype auto`: pick the dtype this machine multiplies fastest, by measuring it (cached per machine).

    python -m walla.extract.dtype_probe [--device cpu] [--refresh]

Whether bfloat16 pays off cannot be read from a spec sheet: on CPUs with AMX a bf16 GEMM runs ~10x
faster than fp32, on CPUs without native bf16 it is emulated and ~4x SLOWER. So `auto` times a square
GEMM per candidate dtype on the target device (a few rounds, interleaved, best of each) and takes the
fastest low-precision dtype when it beats float32 by at least `MARGIN`, else float32.

The GEMM is sized to the device (`probe_shape`): 1024^3 on a CPU (~2 GFLOP, ~1 s in all), 8192^3 on a
GPU with warm-up and `torch.cuda.synchronize` around the timed calls: a 1024^3 GEMM takes microseconds
there, so launch overhead dominated and an H100 read "bf16 65 / fp32 30 TFLOP/s" against real peaks of
~785 / ~52 (issue 22). The line it prints names the shape and the rates it measured.
The measurement is cached as JSON under `<cache_dir>/<machine key>.json`, keyed by the CPU model and flags
(or the GPU name), the kernel path (extract/device.py `kernel_identity`: an ONEDNN_MAX_CPU_ISA cap is another
machine), the torch version and the thread count, with the GEMM side it used (a cache of another
side is measured again); `--refresh` measures again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from walla.extract import device as devices
from walla.extract.models import cache_root
from walla.store import atomic

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MARGIN = 1.2  # a low-precision dtype must be this much faster than float32 to be worth its rounding
PROBE_N = 1024  # square GEMM side on a CPU: ~2 GFLOP, large enough to reach the GEMM kernels' steady state
PROBE_N_CUDA = 8192  # on a GPU: ~1.1 TFLOP, ~1.4 ms in bf16 on an H100 (compute-bound, not launch-bound)
ROUNDS = 3  # interleaved rounds per dtype; the best one counts (robust to a noisy neighbour)

Measure = Callable[[str, str], float]  # (dtype name, device) -> GFLOP/s


def default_cache_dir() -> Path:
    """Where the per-machine measurements live: `$WALLA_CACHE/dtype-probe` (shared by the CLI and benchmarks)."""
    return cache_root() / "dtype-probe"


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype `auto` resolved to and the measurement behind it."""

    dtype: str  # "float32" | "bfloat16" | "float16"
    gflops: dict[str, float]  # measured GEMM GFLOP/s per candidate dtype
    device: str
    cached: str | None = None  # path of the cache file it was read from; None: measured now
    n: int = PROBE_N  # side of the square GEMM that was timed

    def why(self) -> str:
        """One line: the GEMM timed, the rates measured and the rule that picked the dtype."""
        scale, unit = (1e3, "TFLOP/s") if self.device.startswith("cuda") else (1.0, "GFLOP/s")
        ranked = sorted(self.gflops.items(), key=lambda kv: -kv[1])
        rates = ", ".join(f"{k} {v / scale:.{1 if scale > 1 else 0}f}" for k, v in ranked)
        base = self.gflops.get("float32", 0.0)
        if self.dtype == "float32":
            rule = f"no lower-precision dtype is >= {MARGIN}x faster than float32"
        else:
            rule = f"{self.gflops[self.dtype] / max(base, 1e-9):.1f}x float32"
        when = f"cached in {self.cached}" if self.cached else "measured now"
        shape = f"{self.n}x{self.n}x{self.n}, best of {ROUNDS}"
        return f"{self.dtype}: GEMM probe on {self.device} ({shape}) {rates} {unit}; {rule} ({when})"


def candidates(device: str) -> list[str]:
    """float32 and bfloat16; float16 only on GPUs without bf16 (on CPUs fp16 GEMMs are rarely native and
    fp16's range overflows in LLM activations, so it is never the automatic choice there)."""
    if device.startswith("cuda") and not torch.cuda.is_bf16_supported():
        return ["float32", "float16"]
    return ["float32", "bfloat16"]


def probe_shape(device: str) -> tuple[int, int, int]:
    """(GEMM side, timed repetitions, warm-up calls) of the probe on `device` (module docstring)."""
    if device.startswith("cuda"):
        return PROBE_N_CUDA, 10, 3
    return PROBE_N, 2, 1


def gemm_gflops(dtype: str, device: str, n: int | None = None, reps: int | None = None) -> float:
    """GFLOP/s of `reps` n x n x n GEMMs in `dtype` on `device` (one timing; the caller takes the best).

    `n` / `reps` default to the device's `probe_shape`; on CUDA the timed calls are bracketed by
    `torch.cuda.synchronize` (kernels run asynchronously) after warm-up calls (cuBLAS handle, heuristics).
    """
    side, default_reps, warmup = probe_shape(device)
    n, reps = n or side, reps or default_reps
    a = torch.randn(n, n, device=device).to(DTYPES[dtype])
    b = torch.randn(n, n, device=device).to(DTYPES[dtype])
    sync = (lambda: torch.cuda.synchronize(device)) if device.startswith("cuda") else (lambda: None)
    for _ in range(warmup):  # kernel selection, page faults, the CUDA context and cuBLAS handle
        a @ b
    sync()
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync()
    return 2 * n**3 * reps / (time.perf_counter() - t) / 1e9


def measure_all(device: str, measure: Measure, rounds: int = ROUNDS) -> dict[str, float]:
    """Best GFLOP/s per candidate dtype over `rounds` interleaved rounds."""
    best = dict.fromkeys(candidates(device), 0.0)
    for _ in range(rounds):
        for name in best:
            best[name] = max(best[name], float(measure(name, device)))
    return best


def decide(gflops: dict[str, float], margin: float = MARGIN) -> str:
    """The fastest lower-precision dtype if it beats float32 by `margin`, else float32."""
    base = gflops.get("float32", 0.0)
    low = [k for k in gflops if k != "float32"]
    if not low:
        return "float32"
    fastest = max(low, key=lambda k: gflops[k])
    return fastest if gflops[fastest] >= margin * base else "float32"


def machine_key(device: str) -> str:
    """Readable-ish cache key: device kind + a hash of what the GEMM speed depends on."""
    parts = [torch.__version__, str(torch.get_num_threads()), platform.machine()]
    if device.startswith("cuda"):
        idx = torch.device(device).index or 0
        parts += [torch.cuda.get_device_name(idx), str(torch.cuda.get_device_capability(idx))]
    else:
        parts += _cpu_identity()
    # the kernel path (ISA caps such as ONEDNN_MAX_CPU_ISA, ATen's capability, CUDA libraries): other speeds, and
    # other bits for the hf checks cached under this key
    parts.append(json.dumps(devices.kernel_identity(device), sort_keys=True))
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    return f"{device.split(':')[0]}-{digest}"


def _cpu_identity() -> list[str]:
    """CPU model name and feature flags (first processor block of /proc/cpuinfo), else platform info."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return [platform.processor(), platform.platform()]
    keep = {"model name", "flags", "Features", "CPU implementer", "CPU part"}  # x86 and arm spellings
    found: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in keep and key.strip() not in found:
            found[key.strip()] = " ".join(sorted(value.split()))
    return [f"{k}={v}" for k, v in sorted(found.items())]


def probe(
    device: str,
    cache_dir: Path | None = None,
    *,
    refresh: bool = False,
    measure: Measure | None = None,
) -> DtypeChoice:
    """Measured dtype choice for `device`, from the per-machine cache unless `refresh` or absent.

    `measure` (dtype, device) -> GFLOP/s defaults to `gemm_gflops`; tests pass a fake.
    """
    path = cache_dir / f"{machine_key(device)}.json" if cache_dir is not None else None
    n = probe_shape(device)[0]
    if path is not None and path.exists() and not refresh:
        try:
            data = json.loads(path.read_text())
            gflops = {k: float(v) for k, v in data["gflops"].items()}
            # a cache without "n" was measured at PROBE_N (before the side depended on the device)
            if set(gflops) == set(candidates(device)) and int(data.get("n", PROBE_N)) == n:
                return DtypeChoice(decide(gflops), gflops, device, cached=str(path), n=n)
        except (ValueError, KeyError, TypeError, AttributeError):
            pass  # unreadable cache: measure again and overwrite it
    gflops = measure_all(device, measure or gemm_gflops)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"gflops": gflops, "device": device, "torch": torch.__version__, "n": n}
        atomic.write_json(path, record, indent=1)
    return DtypeChoice(decide(gflops), gflops, device, n=n)


def resolve(name: str, device: str, cache_dir: Path | None = None) -> tuple[str, str]:
    """(dtype name, why) for a --dtype value: `auto` is measured (cached), anything else is taken as given.

    Raises:
        ValueError: an unknown dtype name.
    """
    if name == "auto":
        choice = probe(device, cache_dir)
        return choice.dtype, f"auto -> {choice.why()}"
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of auto, {', '.join(DTYPES)}; got {name!r}")
    return name, f"{name}: as given, not measured"


def main() -> None:
    ap = argparse.ArgumentParser(description="measure which dtype runs GEMMs fastest here")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--refresh", action="store_true", help="measure again even when cached")
    args = ap.parse_args()
    print(probe(args.device, default_cache_dir(), refresh=args.refresh).why())


if __name__ == "__main__":
    main()
