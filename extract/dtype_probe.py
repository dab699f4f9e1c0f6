"""`--dtype auto`: pick the dtype this machine multiplies fastest, from its features and a measurement that a
busy machine cannot turn around (cached per machine only when it was taken quiet).

    python -m walla.extract.dtype_probe [--device cpu] [--refresh]

Whether bfloat16 pays off cannot be read from the dtype alone: on CPUs with AMX or AVX512-BF16 a bf16 GEMM runs
5-10x faster than fp32; without them it is emulated and 4-80x SLOWER (this project's AVX2 VM: a 1024^3 bf16
GEMM took 30-87 s under load). So `auto` decides in three steps:

1. The prior: the CPU's features (`amx_bf16`, `avx512_bf16` in /proc/cpuinfo, unless ONEDNN_MAX_CPU_ISA caps
   oneDNN below them) say whether bf16 GEMMs are native; on CUDA, whether the GPU has bf16 tensor cores.
2. The measurement: SAMPLES pairs of GEMM timings, fp32 and the low-precision dtype back to back (the order
   alternating, a pause between pairs), each pair giving a ratio low/fp32. Load that slows both halves of a
   pair cancels in its ratio; the verdict reads the median ratio against MARGIN. Every timing also records
   how much of its wall time the GEMM's threads ran (CPU time / (wall time x threads)).
3. The verdict: when the timings ran under contention (threads ran < QUIET_SHARE of the time, or the pairs'
   ratios spread more than SPREAD_MAX), the features decide and nothing is cached. A measured verdict that
   contradicts the features is measured again after a pause; it stands only when both measurements were
   quiet and agree, and even then it is not cached (measured again every run). Only a quiet verdict that
   agrees with the features (or one on a device without a prior) is cached as the machine's.

The line it prints says which of these decided, with the ratio, the rates, the contention measured and, when
it differs from the verdict cached before, the verdict it replaces: feature sets keep the dtype they ran
(their fingerprints hold the concrete dtype, never `auto`), so a changed verdict makes new sets beside them,
and the line names the dtype that reaches the old ones.

The GEMM is sized to the device (`probe_shape`): 512^3 on a CPU (native bf16 reaches its kernels' steady
state there; emulated bf16 still takes ~0.5 s per call on a loaded 2-core VM), 8192^3 on a GPU with warm-up
and `torch.cuda.synchronize` around the timed calls (a small GEMM there measures launch overhead: an H100 read
"bf16 65 / fp32 30 TFLOP/s" against real peaks of ~785 / ~52, issue 22). A timing repeats its GEMM until
MIN_TIMED_S have passed, so fast and slow dtypes are both timed over more than a scheduler tick.
The measurement is cached as JSON under `<cache_dir>/<machine key>.json`, keyed by the CPU model and flags
(or the GPU name), the kernel path (extract/device.py `kernel_identity`: an ONEDNN_MAX_CPU_ISA cap is another
machine), the torch version and the thread count, with the probe's version and GEMM side (another is measured
again); `--refresh` measures again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from walla.extract import device as devices
from walla.extract.models import cache_root
from walla.store import atomic

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MARGIN = 1.2  # a low-precision dtype must be this much faster than float32 to be worth its rounding
PROBE_N = 512  # square GEMM side on a CPU (module docstring)
PROBE_N_CUDA = 8192  # on a GPU: ~1.1 TFLOP, ~1.4 ms in bf16 on an H100 (compute-bound, not launch-bound)
SAMPLES = 3  # timing pairs per measurement; the median ratio decides
PAUSE_S = 0.05  # between pairs, so that one burst of a neighbour's work falls in one pair, not all
RECHECK_PAUSE_S = 0.5  # before measuring a verdict that contradicts the features again
MIN_TIMED_S = 0.02  # a timing repeats its GEMM until this much wall time has passed (at most MAX_REPS)
MAX_REPS = 50
QUIET_SHARE = 0.75  # below this share of their wall time on a CPU, the GEMM's threads were contended
SPREAD_MAX = 1.5  # max/min of the pairs' ratios above this: the measurements disagree (contended)
NATIVE_BF16 = ("amx_bf16", "avx512_bf16")  # x86 flags of native bf16 GEMMs (oneDNN dispatches on them)
VERSION = (
    2  # of the probe: a cache of another version (one GEMM timing per dtype, best of 3) is measured again
)

_MEMO: dict[str, DtypeChoice] = {}  # this process's verdicts that were not cached on disk (probe)
Measure = Callable[[str, str], "Timing | float"]  # (dtype name, device) -> a timing (a float: GFLOP/s, quiet)


@dataclass(frozen=True)
class Timing:
    """One timed run of GEMMs: its rate, and the share of its wall time its threads were running."""

    gflops: float
    share: float = 1.0  # CPU time / (wall time x threads); 1.0 where not measured (GPU, fakes)


def default_cache_dir() -> Path:
    """Where the per-machine measurements live: `$WALLA_CACHE/dtype-probe` (shared by the CLI and benchmarks)."""
    return cache_root() / "dtype-probe"


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype `auto` resolved to, what decided it and the measurement behind it."""

    dtype: str  # "float32" | "bfloat16" | "float16"
    gflops: dict[str, float]  # median GEMM GFLOP/s per candidate dtype
    device: str
    cached: str | None = None  # path of the cache file it was read from; None: measured now
    n: int = PROBE_N  # side of the square GEMM that was timed
    ratio: float = 0.0  # median of the pairs' low/fp32 rate ratios
    ratios: tuple[float, ...] = ()
    prior: str | None = None  # the dtype the device's features predict; None: no prior
    prior_why: str = ""
    contended: str = ""  # why the measurement counts as contended ("" when quiet)
    decided_by: str = (
        "measurement"  # "measurement" | "features" (contended) | "measurement, against features"
    )
    replaces: str | None = None  # the verdict cached before, when this one differs from it
    stored: bool = field(default=False, compare=False)  # this call wrote it to the cache

    def why(self) -> str:
        """One line: what the features predict, the ratio and rates measured, the contention, what decided."""
        scale, unit = (1e3, "TFLOP/s") if self.device.startswith("cuda") else (1.0, "GFLOP/s")
        low = [k for k in self.gflops if k != "float32"]
        ranked = sorted(self.gflops.items(), key=lambda kv: -kv[1])
        rates = ", ".join(f"{k} {v / scale:.{1 if scale > 1 else 0}f}" for k, v in ranked)
        lo, hi = (min(self.ratios), max(self.ratios)) if self.ratios else (0.0, 0.0)
        spread = f" ({lo:.2f}-{hi:.2f})" if hi > lo else ""
        measured = f"{low[0] if low else 'low'}/float32 {self.ratio:.2f}{spread}" if low else "float32 only"
        pairs = (
            f"{len(self.ratios)} pair{'s' if len(self.ratios) != 1 else ''}" if self.ratios else "no pairs"
        )
        prior = f"features: {self.prior_why}" if self.prior else "no feature prior"
        quiet = f"contended ({self.contended})" if self.contended else "quiet"
        if self.decided_by == "features":
            rule = f"the features decide ({self.prior})"
        else:
            if self.dtype == "float32":
                rule = f"no lower-precision dtype is >= {MARGIN}x faster than float32"
            else:
                rule = f"{self.ratio:.1f}x float32"
            if self.decided_by != "measurement":
                rule += f", {self.decided_by}"
        if self.cached:
            when = f"cached in {self.cached}"
        else:
            when = "measured now, " + ("cached" if self.stored else "not cached")
        if self.replaces:
            when += (
                f"; replaces the cached verdict {self.replaces}: sets extracted before keep their "
                f"{self.replaces} fingerprints, `--dtype {self.replaces}` extends them"
            )
        shape = f"{self.n}x{self.n}x{self.n}, {pairs}"
        return (
            f"{self.dtype}: {prior}; GEMM probe on {self.device} ({shape}) {measured}, {rates} {unit}, "
            f"{quiet}; {rule} ({when})"
        )


def candidates(device: str) -> list[str]:
    """float32 and bfloat16; float16 only on GPUs without bf16 (on CPUs fp16 GEMMs are rarely native and
    fp16's range overflows in LLM activations, so it is never the automatic choice there)."""
    if device.startswith("cuda") and not torch.cuda.is_bf16_supported():
        return ["float32", "float16"]
    return ["float32", "bfloat16"]


def prior(device: str, flags: set[str] | None = None) -> tuple[str | None, str]:
    """(the dtype the device's features predict, why); (None, why) where they say nothing.

    x86: bf16 when the CPU has AMX-BF16 or AVX512-BF16 and ONEDNN_MAX_CPU_ISA does not cap oneDNN below
    them, else float32 (bf16 is emulated). CUDA: the low-precision candidate (tensor cores). Others: none.
    """
    if device.startswith("cuda"):
        return candidates(device)[1], "tensor cores"
    if not device.startswith("cpu"):
        return None, "none for this device"
    flags = devices.cpu_flags() if flags is None else flags
    native = [f for f in NATIVE_BF16 if f in flags]
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if native and cap and cap != "ALL" and not any(w in cap for w in ("AMX", "BF16", "AVX10")):
        return "float32", f"{'/'.join(native)} capped by ONEDNN_MAX_CPU_ISA={cap} (bf16 emulated)"
    if native:
        return "bfloat16", "/".join(native)
    if {"avx2", "sse2", "avx512f"} & flags:
        has = "avx512f" if "avx512f" in flags else "avx2" if "avx2" in flags else "sse2"
        return "float32", f"{has}, no amx_bf16/avx512_bf16 (bf16 emulated)"
    return None, "no known bf16 flags"


def probe_shape(device: str) -> tuple[int, int, int]:
    """(GEMM side, least timed repetitions, warm-up calls) of the probe on `device` (module docstring)."""
    if device.startswith("cuda"):
        return PROBE_N_CUDA, 10, 3
    return PROBE_N, 1, 1


def gemm_timing(dtype: str, device: str, n: int | None = None, reps: int | None = None) -> Timing:
    """One timing of n x n x n GEMMs in `dtype` on `device`: at least `reps`, repeated until MIN_TIMED_S.

    `n` / `reps` default to the device's `probe_shape`; on CUDA the timed calls are bracketed by
    `torch.cuda.synchronize` (kernels run asynchronously) after warm-up calls (cuBLAS handle, heuristics).
    On a CPU the timing also reads the process's CPU time, so a caller can tell a contended run.
    """
    side, least, warmup = probe_shape(device)
    n, least = n or side, reps or least
    a = torch.randn(n, n, device=device).to(DTYPES[dtype])
    b = torch.randn(n, n, device=device).to(DTYPES[dtype])
    cuda = device.startswith("cuda")
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    for _ in range(warmup):  # kernel selection, page faults, the CUDA context and cuBLAS handle
        a @ b
    sync()
    done, cpu0, t0 = 0, time.process_time(), time.perf_counter()
    while done < least or (time.perf_counter() - t0 < MIN_TIMED_S and done < MAX_REPS):
        a @ b
        done += 1
        sync()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    share = 1.0 if cuda else min(1.0, cpu / max(wall * torch.get_num_threads(), 1e-9))
    return Timing(2 * n**3 * done / wall / 1e9, share)


def gemm_gflops(dtype: str, device: str, n: int | None = None, reps: int | None = None) -> float:
    """GFLOP/s of one `gemm_timing` (the benchmarks' peak figures)."""
    return gemm_timing(dtype, device, n, reps).gflops


def _timing(value: Timing | float) -> Timing:
    return value if isinstance(value, Timing) else Timing(float(value))


@dataclass(frozen=True)
class Measurement:
    gflops: dict[str, float]  # median rate per dtype
    ratios: tuple[float, ...]  # per pair: low / fp32
    contended: str  # "" when quiet

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios) if self.ratios else 0.0


def measure_pairs(
    device: str, measure: Measure, samples: int = SAMPLES, pause_s: float = PAUSE_S, give_up: bool = False
) -> Measurement:
    """`samples` interleaved pairs (fp32 and the low dtype back to back, order alternating), with the
    contention they ran under: the GEMM threads' median share of wall time, and the spread of the ratios.
    `give_up`: stop after a contended first pair (the features will decide: no need to pay for more)."""
    names = candidates(device)
    low = names[1] if len(names) > 1 else None
    rates: dict[str, list[float]] = {k: [] for k in names}
    shares: list[float] = []
    ratios: list[float] = []
    for i in range(samples):
        if i and pause_s:
            time.sleep(pause_s)
        order = names if i % 2 == 0 else names[::-1]
        got = {k: _timing(measure(k, device)) for k in order}
        for k, t in got.items():
            rates[k].append(t.gflops)
            shares.append(t.share)
        if low is not None:
            ratios.append(got[low].gflops / max(got["float32"].gflops, 1e-12))
        if give_up and statistics.median(shares) < QUIET_SHARE:
            break
    gflops = {k: statistics.median(v) for k, v in rates.items()}
    why = []
    share = statistics.median(shares) if shares else 1.0
    if share < QUIET_SHARE:
        why.append(f"GEMM threads ran {share:.0%} of the time")
    if len(ratios) > 1 and max(ratios) > SPREAD_MAX * max(min(ratios), 1e-12):
        why.append(f"ratios {min(ratios):.2f}-{max(ratios):.2f} disagree")
    if why:
        why.append(load_line())
    return Measurement(gflops, tuple(ratios), "; ".join(why))


def load_line() -> str:
    """The 1-minute load average against the CPUs, for the reason of a contended verdict."""
    try:
        load = float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return "load unknown"
    return f"load {load:.1f} on {os.cpu_count()} CPUs"


def decide_ratio(ratio: float, device: str, margin: float = MARGIN) -> str:
    """The low-precision candidate when it ran `margin`x faster than float32 (by the median ratio)."""
    names = candidates(device)
    return names[1] if len(names) > 1 and ratio >= margin else "float32"


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


def _read_cache(path: Path | None, device: str, n: int) -> tuple[dict | None, str | None]:
    """(a usable cache record, the verdict any readable record held) of `path`."""
    if path is None or not path.exists():
        return None, None
    try:
        data = json.loads(path.read_text())
        old = data.get("dtype") or decide({k: float(v) for k, v in data["gflops"].items()})
        usable = (
            data.get("version") == VERSION
            and int(data.get("n", 0)) == n
            and set(data["gflops"]) == set(candidates(device))
        )
        return (data if usable else None), str(old)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None, None  # unreadable cache: measure again and overwrite it


def probe(
    device: str,
    cache_dir: Path | None = None,
    *,
    refresh: bool = False,
    measure: Measure | None = None,
    pause_s: float | None = None,
) -> DtypeChoice:
    """The dtype `auto` takes on `device` (module docstring), from the per-machine cache unless `refresh`.

    `measure` (dtype, device) -> Timing (or GFLOP/s) defaults to `gemm_timing`; tests pass a fake. A
    verdict not cached on disk (contended, or against the features) is remembered for the rest of this process
    when `gemm_timing` measured it, so one process measures once.
    """
    pause_s = PAUSE_S if pause_s is None else pause_s
    path = cache_dir / f"{machine_key(device)}.json" if cache_dir is not None else None
    n = probe_shape(device)[0]
    want, want_why = prior(device)
    record, old = _read_cache(path, device, n)
    if record is not None and not refresh:
        return DtypeChoice(
            record["dtype"],
            {k: float(v) for k, v in record["gflops"].items()},
            device,
            cached=str(path),
            n=n,
            ratio=float(record["ratio"]),
            ratios=tuple(record["ratios"]),
            prior=want,
            prior_why=want_why,
        )
    real, measure = measure is None, measure or gemm_timing
    memo_key = f"{path or machine_key(device)} {id(measure)}"
    if real and not refresh and memo_key in _MEMO:
        return _MEMO[memo_key]
    m = measure_pairs(device, measure, pause_s=pause_s, give_up=want is not None)
    verdict, decided_by, cache = decide_ratio(m.ratio, device), "measurement", not m.contended
    if want is not None and m.contended:
        verdict, decided_by, cache = want, "features", False
    elif want is not None and verdict != want:
        time.sleep(pause_s and RECHECK_PAUSE_S)
        again = measure_pairs(device, measure, pause_s=pause_s, give_up=True)
        if again.contended or decide_ratio(again.ratio, device) != verdict:
            verdict, decided_by = want, "features"
            m = again if again.contended else m
        else:
            decided_by = f"against the features (measured twice; next run measures again: {again.ratio:.2f})"
        cache = False
    replaces = old if old is not None and old != verdict else None
    stored = False
    if path is not None and cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "version": VERSION,
            "dtype": verdict,
            "gflops": m.gflops,
            "ratio": m.ratio,
            "ratios": list(m.ratios),
            "device": device,
            "torch": torch.__version__,
            "n": n,
            "measured_at": time.time(),
        }
        atomic.write_json(path, record, indent=1)
        stored = True
    choice = DtypeChoice(
        verdict,
        m.gflops,
        device,
        n=n,
        ratio=m.ratio,
        ratios=m.ratios,
        prior=want,
        prior_why=want_why,
        contended=m.contended,
        decided_by=decided_by,
        replaces=replaces,
        stored=stored,
    )
    if real and not stored:
        _MEMO[memo_key] = choice
    return choice


def resolve(name: str, device: str, cache_dir: Path | None = None) -> tuple[str, str]:
    """(dtype name, why) for a --dtype value: `auto` is decided by `probe`, anything else is taken as given.

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
    ap = argparse.ArgumentParser(description="decide which dtype runs GEMMs fastest here")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--refresh", action="store_true", help="measure again even when cached")
    args = ap.parse_args()
    print(probe(args.device, default_cache_dir(), refresh=args.refresh).why())


if __name__ == "__main__":
    main()
