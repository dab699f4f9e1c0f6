"""Adam for StackedHeads under bf16-mixed on the CPU: float32 master weights, bf16 gradients, ONE pass per step.

    opt = stacked_adam(heads, lr, precision, device)   # MasterAdam when it applies, else torch's fused Adam
    ... forward (bf16 working weights) -> backward (bf16 gradients) -> heads.clip_per_head_(1.0) -> opt.step()

Why: at the paper's width (4.6M parameters per head) a bf16-mixed step is memory-bound, and the plain
autocast recipe moves every parameter four extra times: fp32 weight -> bf16 copy before the GEMMs (read 4,
write 2), bf16 weight gradient -> fp32 .grad (read 2, write 4), the clip multiply (read 4, write 4), then
torch's fused Adam (28). MasterAdam's kernel reads the bf16 gradient and the fp32 master p, m, v once and
writes p, m, v and the bf16 working copy the next forward uses (30 bytes per parameter instead of ~56).

Same math as that recipe: the bf16 GEMM rounds the weight gradient to bf16 either way (the fp32 .grad was
its exact conversion); the per-head clip coefficient multiplies it in float32 as clip_grad_norm_'s mul_
did; then torch.optim.Adam's update (fused CPU kernel's formula: m = fma(1 - b1, g - m, m),
v = v b2 + (1 - b2) g g, p += (-lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)), in float32.
The bf16 working copy is p rounded to nearest even, exactly what the autocast cast produced.

The kernel is a few lines of C compiled once per machine with the system C compiler (cached under
$WALLA_CACHE or ~/.cache/walla, ~0.2 s) and run on torch's thread count through ctypes (which releases the
GIL). Without a compiler, or on another device or precision, `stacked_adam` returns torch's Adam and the
heads keep the autocast recipe (`unavailable()` says why).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

ENABLED = True  # tests and benchmarks switch it off to compare with the autocast recipe

_SOURCE = r"""
#include <stdint.h>
#include <string.h>
#include <math.h>
static inline float bf2f(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint16_t f2bf(float f) {  /* round to nearest even; NaN stays NaN (as torch's cast) */
    uint32_t u; memcpy(&u, &f, 4);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)(((u & 0x7fffffffu) > 0x7f800000u) ? ((u >> 16) | 0x40u) : r);
}
/* elements [lo, hi) of one stacked parameter; head h owns [h * per_head, (h + 1) * per_head) */
void adam_bf16(float *restrict p, float *restrict m, float *restrict v, const uint16_t *restrict g,
               uint16_t *restrict w, int64_t lo, int64_t hi, int64_t per_head, const float *restrict coef,
               float one_minus_b1, float b2, float one_minus_b2, float neg_step, float bc2_sqrt, float eps) {
    while (lo < hi) {
        int64_t h = lo / per_head, end = (h + 1) * per_head < hi ? (h + 1) * per_head : hi;
        const float c = coef[h];
        for (int64_t i = lo; i < end; i++) {
            float gr = bf2f(g[i]) * c;
            float mi = fmaf(one_minus_b1, gr - m[i], m[i]);
            float vi = v[i] * b2 + one_minus_b2 * gr * gr;
            float pi = p[i] + neg_step * mi / (sqrtf(vi) / bc2_sqrt + eps);
            m[i] = mi; v[i] = vi; p[i] = pi; w[i] = f2bf(pi);
        }
        lo = end;
    }
}
/* out[h - lo / per_head] += sum of squares of elements [lo, hi) of head h (16 float lanes, double per block) */
void sumsq_bf16(const uint16_t *restrict g, int64_t lo, int64_t hi, int64_t per_head, double *restrict out) {
    while (lo < hi) {
        int64_t h = lo / per_head, end = (h + 1) * per_head < hi ? (h + 1) * per_head : hi;
        double total = 0.0;
        for (int64_t i = lo; i < end; i += 4096) {
            int64_t stop = i + 4096 < end ? i + 4096 : end, j = i;
            float acc[16] = {0};
            for (; j + 16 <= stop; j += 16)
                for (int k = 0; k < 16; k++) { float x = bf2f(g[j + k]); acc[k] += x * x; }
            for (; j < stop; j++) { float x = bf2f(g[j]); acc[0] += x * x; }
            for (int k = 0; k < 16; k++) total += acc[k];
        }
        out[h] += total;
        lo = end;
    }
}
"""
_FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-shared", "-fPIC"]
_MIN_CHUNK = 1 << 16  # elements; smaller parameters run in the calling thread


def _cpu() -> str:
    """What -march=native compiles for: a library built on one CPU must not load on another (shared home)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    return "\n".join(dict.fromkeys(ln for ln in lines if ln.startswith(("model name", "flags", "Features"))))


@functools.cache
def _kernel() -> tuple[ctypes.CDLL | None, str]:
    """(the compiled library: adam_bf16, sumsq_bf16; "") or (None, why not)."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return None, "no C compiler on PATH (cc, gcc, clang)"
    key = hashlib.sha256("\0".join([_SOURCE, cc, *_FLAGS, _cpu()]).encode()).hexdigest()[:16]
    root = Path(os.environ.get("WALLA_CACHE", Path.home() / ".cache" / "walla")) / "kernels"
    lib = root / f"adam_bf16-{key}.so"
    try:
        if not lib.exists():
            root.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=root) as tmp:
                src, out = Path(tmp) / "k.c", Path(tmp) / "k.so"
                src.write_text(_SOURCE)
                subprocess.run([cc, *_FLAGS, str(src), "-o", str(out)], check=True, capture_output=True)
                os.replace(out, lib)  # atomic: concurrent builders never see a partial file
        dll = ctypes.CDLL(str(lib))
    except (OSError, subprocess.CalledProcessError) as e:
        return None, f"compiling the Adam kernel failed ({type(e).__name__}: {str(e)[:160]})"
    dll.adam_bf16.restype = dll.sumsq_bf16.restype = None
    dll.adam_bf16.argtypes = (
        [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 3 + [ctypes.c_void_p] + [ctypes.c_float] * 6
    )
    dll.sumsq_bf16.argtypes = [ctypes.c_void_p] + [ctypes.c_int64] * 3 + [ctypes.c_void_p]
    return dll, ""


def unavailable(precision: str, device: torch.device) -> str:
    """Why MasterAdam does not apply ("" when it does)."""
    if not ENABLED:
        return "switched off (mixed_adam.ENABLED)"
    if precision != "bf16-mixed" or device.type != "cpu":
        return f"only for bf16-mixed on the CPU (here {precision} on {device.type})"
    return _kernel()[1]


@functools.cache
def _pool(n: int, pid: int) -> ThreadPoolExecutor:
    """Worker threads, per process (a forked child must not inherit the parent's dead threads)."""
    return ThreadPoolExecutor(n, thread_name_prefix="walla-adam")


def _ranges(n: int, nt: int):
    """[lo, hi) element ranges of one parameter for nt threads (one range when it is small)."""
    size = max(_MIN_CHUNK, -(-n // nt))
    return [(lo, min(n, lo + size)) for lo in range(0, n, size)]


def _run(calls: list) -> None:
    """Run (fn, *args) calls on torch's thread count (ctypes releases the GIL while a kernel runs)."""
    nt = torch.get_num_threads()
    if nt == 1:
        for c in calls:
            c[0](*c[1:])
        return
    for job in [_pool(nt, os.getpid()).submit(*c) for c in calls]:
        job.result()


def sq_norms(grads: list[torch.Tensor]) -> torch.Tensor:
    """Per-head squared L2 norms [G] (float64) over bf16 gradients [G, ...] in one read of each (the float32
    conversion vector_norm would make first costs a write and a read more)."""
    fn, nt = _kernel()[0].sumsq_bf16, torch.get_num_threads()
    calls, outs = [], []
    for g in grads:
        n = g.numel()
        for lo, hi in _ranges(n, nt):
            outs.append(torch.zeros(g.shape[0], dtype=torch.float64, device="cpu"))
            calls.append((fn, g.data_ptr(), lo, hi, n // g.shape[0], outs[-1].data_ptr()))
    _run(calls)
    return torch.stack(outs).sum(0)


class MasterAdam(torch.optim.Optimizer):
    """Adam over a StackedHeads' float32 parameters from the bf16 gradients its backward writes (module
    docstring); enables the heads' master mode. Per-head clip coefficients come from heads.grad_coef."""

    def __init__(
        self, heads, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8
    ) -> None:
        super().__init__(heads.parameters(), {"lr": lr, "betas": betas, "eps": eps})
        for p in heads.parameters():  # the kernel reads raw memory
            assert p.dtype == torch.float32 and p.device.type == "cpu" and p.is_contiguous(), (
                p.dtype,
                p.device,
            )
        self.heads = heads
        self.low = heads.enable_masters(torch.bfloat16)  # per parameter: (bf16 working copy, bf16 gradient)
        self.fn = _kernel()[0].adam_bf16

    @torch.no_grad()
    def step(self, closure=None):
        assert closure is None, "MasterAdam takes no closure"
        nt = torch.get_num_threads()
        coef = self.heads.grad_coef
        if coef is None:
            coef = torch.ones(self.heads.n_heads, dtype=torch.float32, device="cpu")
        coef = coef.float().contiguous()
        calls = []
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                st = self.state[p]
                if not st:
                    st["step"] = torch.zeros((), dtype=torch.float32, device="cpu")
                    st["exp_avg"], st["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
                st["step"] += 1
                t = float(st["step"])  # the fused kernel's scalars: double math, then float
                scal = (1 - b1, b2, 1 - b2, -group["lr"] / (1 - b1**t), (1 - b2**t) ** 0.5, group["eps"])
                work, grad = self.low[p]
                ptrs = [x.data_ptr() for x in (p, st["exp_avg"], st["exp_avg_sq"], grad, work)]
                per_head = p.numel() // p.shape[0]
                calls += [
                    (self.fn, *ptrs, lo, hi, per_head, coef.data_ptr(), *scal)
                    for lo, hi in _ranges(p.numel(), nt)
                ]
        _run(calls)


def stacked_adam(heads, lr: float, precision: str, device: torch.device) -> torch.optim.Optimizer:
    """MasterAdam where it applies (bf16-mixed on the CPU with a C compiler), else torch.optim.Adam (fused
    on CPU and CUDA: one pass over the parameters) -- the same update either way."""
    if not unavailable(precision, device):
        return MasterAdam(heads, lr)
    fused = {"fused": True} if device.type in ("cpu", "cuda") else {}
    return torch.optim.Adam(heads.parameters(), lr=lr, **fused)
