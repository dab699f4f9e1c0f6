"""The training engine: where training runs, and the one optimizer of every loop.

    env = TrainEnv(device=resolve_device("auto"), precision=resolve_precision("auto", device))
    fabric = make_fabric(env)                          # Lightning Fabric: device + precision plugin
    opt = make_optimizer(params, "adamw", lr=1e-4, weight_decay=1e-5, device=env.device)
    net, opt = fabric.setup(module, opt)               # moves the module, wraps forward in the precision
    ...
    opt.zero_grad(set_to_none=True)
    fabric.backward(loss)
    norms = clip_gradients(fabric, opt, max_norm=1.0, scope="slice")   # engine/clipping.py: pre-clip norms
    opt.step()

Every gradient-trained loop of walla goes through these pieces: the generic one-module loop
(fit_loop.fit_module: StackedGen, the routers), WALLA's batched wager heads (wagers/training.py) and
the calibration heads (calibration/temperature.py). Optimizers are torch's own (Adam, AdamW, SGD), fused where the
device has a fused kernel; precision is Lightning's plugin for `env.precision` (autocast for
"-mixed", a parameter dtype for "-true", the loss scaler for 16-mixed). Gradients are clipped by
engine/clipping.py (one definition, three scopes); what a fit may hold on the device and how data crosses to it
and back is engine/memory.py.

Seeding stays local (`seeded(seed)` forks torch's RNG; fabric.seed_everything is never used). Importing
Fabric costs 3.3-3.5 s warm, 8.3 s cold (2-core CPU, load 7-9) once per process, on the first make_fabric.

Parameters are initialised where they train (`init_device`, `init_generator`, `linear_init_`): nn.Linear's
default init drawn in place from a generator on that device seeded with the run's seed. Host init then a
copy cost 2.9 s of a 6 s seed on an H100 (228M parameters drawn by one CPU thread). On the CPU the
generator is the one `seeded(seed)` would seed, so the values are those of `with seeded(seed):
nn.Linear(...)`, bit for bit (tests/train/test_device_init.py); on CUDA a Philox generator draws other values
from the same seed (the run key records the device kind, train/runs/_identity.py). Other devices (MPS) keep the
host's init, moved by Fabric.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning_fabric import Fabric
from torch import nn
from walla.manifests.validate import UsageError
from walla.train.engine._memory import state_to_host

OPTIMIZERS = ("adam", "adamw", "sgd")
FUSED_DEVICES = ("cpu", "cuda")  # device types with torch's fused Adam/AdamW kernel
PRECISIONS = ("32-true", "64-true", "bf16-mixed", "16-mixed", "bf16-true")
PRECISION_ALIASES = {
    "32": "32-true",
    "64": "64-true",
    "bf16": "bf16-mixed",
    "16": "16-mixed",
}
# "auto" picks bf16-mixed only when the measured bf16 GEMM is this much faster than float32
BF16_MIN_SPEEDUP = 1.3


@dataclass(frozen=True)
class TrainEnv:
    """Where and how training runs; every method's fit/predict receives one."""

    device: str = "cpu"  # resolved torch device: "cpu" | "cuda" | "cuda:N" | "mps"
    precision: str = "32-true"  # Lightning precision, one of PRECISIONS
    store: Path | None = None  # feature store root (router text-embedding cache)


# ---------------------------------------------------------------------------- device and precision


def resolve_device(name: str) -> str:
    """ "auto" | "cpu" | "cuda[:N]" | "mps" -> a concrete device; one-line ValueError if unavailable."""
    name = str(name).strip().lower()
    if name == "auto":
        if torch.cuda.is_available():
            return "cuda"
        return "mps" if torch.backends.mps.is_available() else "cpu"
    if name == "cpu":
        return "cpu"
    if name == "cuda" or name.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise UsageError(
                f"device {name!r} requested but CUDA is not available "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'none'})"
            )
        index = name.partition(":")[2]
        if index and (not index.isdigit() or int(index) >= torch.cuda.device_count()):
            raise UsageError(f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
        return name
    if name == "mps":
        if not torch.backends.mps.is_available():
            raise UsageError("device 'mps' requested but Apple MPS is not available on this machine")
        return "mps"
    raise UsageError(f"device must be auto | cpu | cuda | cuda:N | mps, got {name!r}")


@functools.cache
def gemm_flops(dtype: torch.dtype, device: str = "cpu", n: int = 1024, seconds: float = 0.3) -> float:
    """Measured FLOP/s of an n x n x n GEMM in `dtype` on `device` (best of repeated timings; cached)."""
    dev = torch.device(device)
    a, b = (torch.randn(n, n, device=dev).to(dtype) for _ in range(2))
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    torch.mm(a, b)  # warm-up (kernel selection, oneDNN/AMX initialisation)
    sync()
    best, spent, reps = math.inf, 0.0, 0
    while spent < seconds or reps < 3:
        t0 = time.perf_counter()
        torch.mm(a, b)
        sync()
        dt = time.perf_counter() - t0
        best, spent, reps = min(best, dt), spent + dt, reps + 1
    return 2.0 * n**3 / best


def resolve_precision(name: str, device: str) -> str:
    """Lightning precision for `name` ("auto", "32", "bf16", "bf16-mixed", ...) on a resolved device.

    "auto" MEASURES (a short GEMM probe, `gemm_flops`): bf16-mixed when a bf16 GEMM runs at least
    BF16_MIN_SPEEDUP x faster than float32 on this device (native bf16: AMX/AVX512-BF16 CPUs, Ampere+
    GPUs), else 32-true. Machines without native bf16 emulate it, often ~4x slower than float32.
    """
    name = str(name).strip().lower()
    if name == "auto":
        if torch.device(device).type == "mps":
            return "32-true"
        bf16, fp32 = gemm_flops(torch.bfloat16, device), gemm_flops(torch.float32, device)
        return "bf16-mixed" if bf16 >= BF16_MIN_SPEEDUP * fp32 else "32-true"
    name = PRECISION_ALIASES.get(name, name)
    if name not in PRECISIONS:
        raise UsageError(
            f"precision must be auto | {' | '.join(PRECISIONS)} (or 32, 64, bf16, 16), got {name!r}"
        )
    if name == "16-mixed" and torch.device(device).type == "cpu":
        raise UsageError("precision '16-mixed' needs a GPU; use bf16-mixed or 32-true on the CPU")
    return name


# ---------------------------------------------------------------------------- Fabric, seeds, batches


def _quiet_lightning() -> None:
    # Fabric's loggers; the `lightning` ones where an installed `lightning` serves --logger wandb (loggers.py)
    for name in ("lightning_fabric", "lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*GPU available.*")
    # lightning's own pytree deprecation notice
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")


def make_fabric(env: TrainEnv, loggers: Any = None):
    """A single-device Fabric for `env`."""
    _quiet_lightning()
    dev = torch.device(env.device)
    accelerator = {"cuda": "cuda", "mps": "mps"}.get(dev.type, "cpu")
    devices = [dev.index] if dev.type == "cuda" and dev.index is not None else 1
    return Fabric(accelerator=accelerator, devices=devices, precision=env.precision, loggers=loggers)


@contextmanager
def seeded(seed: int, device: str = "cpu") -> Iterator[None]:
    """Run a block with torch's global RNG seeded, restoring the caller's RNG state afterwards.

    Used for module init and dropout so a run never depends on (or disturbs) global RNG state.
    """
    dev = torch.device(device)
    devices = [dev.index or 0] if dev.type == "cuda" and torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def init_device(device: str | torch.device) -> torch.device:
    """Where parameters for `device` are initialised: the CPU and CUDA in place, other devices on the host."""
    dev = torch.device(device)
    return dev if dev.type in ("cpu", "cuda") else torch.device("cpu")


def init_generator(seed: int, device: str | torch.device) -> torch.Generator:
    """A generator on `device` seeded with `seed`: the stream a module's init draws from.

    On the CPU it is the stream `seeded(seed)` gives torch's global generator (same algorithm, same seed),
    so init drawn from it equals init drawn under `seeded(seed)`; on CUDA it is a device (Philox)
    generator: no host draw, no host-to-device copy, and different values from the CPU's.
    """
    return torch.Generator(device=torch.device(device)).manual_seed(int(seed))


@torch.no_grad()
def linear_init_(weight: torch.Tensor, bias: torch.Tensor, generator: torch.Generator) -> None:
    """nn.Linear(in, out)'s default init, in place, of a layer stored transposed: weight [in, out], bias [out].

    Drawn as nn.Linear draws it (a weight [out, in] in row order, then the bias; both U(+-1/sqrt(in))),
    from `generator`, on the parameters' device.
    """
    w = torch.empty(weight.shape[1], weight.shape[0], dtype=weight.dtype, device=weight.device)  # [out, in]
    nn.init.kaiming_uniform_(w, a=math.sqrt(5), generator=generator)
    weight.copy_(w.T)
    bound = 1 / math.sqrt(weight.shape[0]) if weight.shape[0] > 0 else 0
    nn.init.uniform_(bias, -bound, bound, generator=generator)


def row_batches(
    rows: np.ndarray, batch_size: int, seed: int | None, drop_last: bool = False
) -> list[np.ndarray]:
    """Split `rows` into batches after ONE seeded shuffle (reused every epoch, SPEC §3.2 / §10.13).

    `seed=None` keeps the given order. The last partial batch is kept unless `drop_last`.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    rows = np.asarray(rows)
    if seed is not None:
        rows = rows[np.random.default_rng(seed).permutation(len(rows))]
    out = [rows[i : i + batch_size] for i in range(0, len(rows), batch_size)]
    if drop_last and out and len(out[-1]) < batch_size:
        out = out[:-1]
    return out


# ---------------------------------------------------------------------------- optimizer


def make_optimizer(
    params: Iterable[nn.Parameter] | list[dict],
    optimizer: str = "adam",
    lr: float = 1e-3,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
    device: str = "cpu",
) -> torch.optim.Optimizer:
    """torch's Adam / AdamW / SGD over parameters or param groups (dicts may carry their own lr).

    `device` is where the parameters will train (fabric.setup moves them there). On CPU and CUDA
    Adam/AdamW are fused: one pass over p, grad, m, v per step where the default CPU path makes ~7
    (its passes were ~40% of StackedGen's 4096-wide fit); same update formula up to an ulp.
    Elsewhere torch picks its default (foreach) implementation.
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    if not (lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr must be a positive finite number, got {lr!r}")
    params = list(params)
    if optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay)
    tensors = [t for g in params for t in (g["params"] if isinstance(g, dict) else [g])]
    fused = torch.device(device).type in FUSED_DEVICES and all(t.is_floating_point() for t in tensors)
    cls = torch.optim.Adam if optimizer == "adam" else torch.optim.AdamW
    return cls(params, lr=lr, betas=betas, weight_decay=weight_decay, fused=fused or None)


# ---------------------------------------------------------------------------- checkpoints


def save_checkpoint(path: str | Path, state: dict[str, Any], fabric: Any = None) -> None:
    """Write `state` (tensors, arrays, json-able values) atomically (tmp + rename): torch.save, or fabric.save
    when a `fabric` is given.

    Tensors are written from the host (states of a CUDA fit live on the device until saved), so a checkpoint
    reads back on any machine. A single-device Fabric's save writes the same bytes after buffering the whole
    file in memory: 3-6x the time for a demo state (0.03 vs 0.01 s), the file's size again in memory for a
    paper one (~0.9 GB a seed); fabric.load and torch.load read it.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        if fabric is None:
            with open(tmp, "wb") as f:  # a file object: the archive inside is named "archive", as Fabric's
                torch.save(state_to_host(state), f)
        else:
            fabric.save(tmp, state_to_host(state))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_checkpoint(path: str | Path, state: dict[str, Any] | None = None, fabric: Any = None) -> dict:
    """Read a checkpoint written by save_checkpoint (fabric.load; modules in `state` load in place)."""
    fabric = fabric if fabric is not None else make_fabric(TrainEnv())
    return fabric.load(Path(path), state, weights_only=False)
