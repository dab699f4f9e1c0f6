"""The training engine: Lightning Fabric drives every gradient-trained loop of walla.

    from walla.train.engine import TrainEnv, fit_module, make_fabric, row_batches, seeded

    env = TrainEnv(device=resolve_device("auto"), precision=resolve_precision("auto", device))
    with seeded(seed):                                       # init is the caller's: seed it
        net = MyHead(...)
    batches = row_batches(train_rows, batch_size=100, seed=seed)   # shuffled once (SPEC §3.2)
    res = fit_module(
        net,
        loss_fn=lambda net, rows: ce_of_pool(net(x[rows]), probs[rows], target[rows]),
        train_batches=batches,                  # list of batches, or callable epoch -> iterable
        env=env,                                # device + Lightning precision
        val_fn=lambda net: val_kl(net),         # optional: per-epoch, lower is better, best restored
        optimizer="adamw", lr=5e-5, weight_decay=0.01, epochs=5, patience=5, clip=1.0,
        seed=seed, log=log,                     # log(dict) once per training batch
    )
    res.module                                  # best (or last) state, in eval mode, on env.device

Per batch: zero_grad -> loss_fn(module, batch) (the Fabric-wrapped module: its forward runs under the
precision's autocast / dtype conversion) -> fabric.backward -> clip (fabric.clip_gradients for one
param group; per group, or the caller's `clip_fn`, otherwise) -> skip the step if the gradient norm is
non-finite or above `skip_grad_norm_above` -> optimizer.step -> log -> on_step (may stop).
Per epoch (if val_fn): eval mode, no_grad val_fn(module) -> on strict improvement (by more than
min_delta) the state is checkpointed with fabric.save into a temporary directory -> stop after
`patience` epochs without one; the best checkpoint is restored with fabric.load at the end.

Loops that are not "one module, one loss, one optimizer" (batched WALLA and calibration heads) use
`make_fabric(env)` and fabric.setup / backward / autocast directly (methods/walla.py, calibration.py).

Seeding stays local (`seeded(seed)` forks torch's RNG; fabric.seed_everything is never used). Importing
Fabric costs 3.3-3.5 s warm, 8.3 s cold (2-core CPU, load 7-9) once per process, on the first make_fabric.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from walla.train.methods import LogFn

LossOut = torch.Tensor | tuple[torch.Tensor, dict[str, float]]
OPTIMIZERS = ("adam", "adamw", "sgd")
PRECISIONS = ("32-true", "64-true", "bf16-mixed", "16-mixed", "bf16-true")
PRECISION_ALIASES = {"32": "32-true", "64": "64-true", "bf16": "bf16-mixed", "16": "16-mixed"}
BF16_MIN_SPEEDUP = 1.3  # "auto" picks bf16-mixed only when the measured bf16 GEMM is this much faster


@dataclass(frozen=True)
class TrainEnv:
    """Where and how training runs; every method's fit/predict receives one."""

    device: str = "cpu"  # resolved torch device: "cpu" | "cuda" | "cuda:N" | "mps"
    precision: str = "32-true"  # Lightning precision, one of PRECISIONS
    store: Path | None = None  # feature store root (router text-embedding cache)

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)


def resolve_device(name: str) -> str:
    """ "auto" | "cpu" | "cuda[:N]" | "mps" -> a concrete device; one-line ValueError if unavailable."""
    name = str(name).strip().lower()
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    if name == "cpu":
        return "cpu"
    if name == "cuda" or name.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ValueError(
                f"device {name!r} requested but CUDA is not available "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'none'})"
            )
        index = name.partition(":")[2]
        if index and (not index.isdigit() or int(index) >= torch.cuda.device_count()):
            raise ValueError(f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
        return name
    if name == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError("device 'mps' requested but Apple MPS is not available on this machine")
        return "mps"
    raise ValueError(f"device must be auto | cpu | cuda | cuda:N | mps, got {name!r}")


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
        fast = gemm_flops(torch.bfloat16, device) >= BF16_MIN_SPEEDUP * gemm_flops(torch.float32, device)
        return "bf16-mixed" if fast else "32-true"
    name = PRECISION_ALIASES.get(name, name)
    if name not in PRECISIONS:
        raise ValueError(
            f"precision must be auto | {' | '.join(PRECISIONS)} (or 32, 64, bf16, 16), got {name!r}"
        )
    if name == "16-mixed" and torch.device(device).type == "cpu":
        raise ValueError("precision '16-mixed' needs a GPU; use bf16-mixed or 32-true on the CPU")
    return name


def _quiet_lightning() -> None:
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*GPU available.*")
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")  # lightning's own pytree deprecation notice


def make_fabric(env: TrainEnv, loggers: Any = None):
    """A single-device Fabric for `env` (imports Lightning on first use)."""
    from lightning.fabric import Fabric

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


def make_optimizer(
    params: Iterable[nn.Parameter] | list[dict],
    optimizer: str = "adam",
    lr: float = 1e-3,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
) -> torch.optim.Optimizer:
    """Adam / AdamW / SGD over parameters or torch-style param groups (dicts may carry their own lr)."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    if not (lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr must be a positive finite number, got {lr!r}")
    params = list(params)
    if optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay)
    # fused: one pass over p, grad, m, v per step where the default CPU path makes ~7 (its passes were ~40%
    # of StackedGen's 4096-wide fit). Same update formula; rounding differs by ~1 ulp.
    tensors = [t for g in params for t in (g["params"] if isinstance(g, dict) else [g])]
    fused = all(t.is_floating_point() and t.device.type in ("cpu", "cuda") for t in tensors)
    cls = torch.optim.Adam if optimizer == "adam" else torch.optim.AdamW
    return cls(params, lr=lr, betas=betas, weight_decay=weight_decay, fused=fused or None)


def save_checkpoint(path: str | Path, state: dict[str, Any], fabric: Any = None) -> None:
    """Write `state` (tensors, arrays, json-able values) with fabric.save, atomically (tmp + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fabric = fabric if fabric is not None else make_fabric(TrainEnv())
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        fabric.save(tmp, state)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_checkpoint(path: str | Path, state: dict[str, Any] | None = None, fabric: Any = None) -> dict:
    """Read a checkpoint written by save_checkpoint (fabric.load; modules in `state` load in place)."""
    fabric = fabric if fabric is not None else make_fabric(TrainEnv())
    return fabric.load(Path(path), state, weights_only=False)


@dataclass
class FitResult:
    module: nn.Module  # best state if val_fn improved at least once, else the last state
    steps: int  # optimizer steps attempted (skipped ones included)
    epochs_run: int
    best_epoch: int | None  # 0-based epoch whose val was best (None without val_fn)
    best_val: float | None
    stopped_early: bool
    history: list[dict[str, float]] = field(default_factory=list)  # per epoch: epoch, val, train_loss


def _batch_len(batch: Any) -> int:
    if isinstance(batch, torch.Tensor | np.ndarray):
        return int(batch.shape[0]) if batch.ndim else 1
    if isinstance(batch, dict) and batch:
        return _batch_len(next(iter(batch.values())))
    if isinstance(batch, list | tuple) and batch:
        return _batch_len(batch[0])
    return 1


def _clip(fabric, module, opt, clip: float | None, clip_fn) -> float:
    """Clip gradients; return the largest pre-clip norm (per param group, or the caller's clip_fn's)."""
    groups = [[p for p in g["params"] if p.grad is not None] for g in opt.param_groups]
    groups = [g for g in groups if g]
    if clip_fn is None and clip is not None and len(groups) == 1:
        return float(fabric.clip_gradients(module, opt, max_norm=clip, error_if_nonfinite=False))
    fabric.strategy.precision.unscale_gradients(opt.optimizer)  # 16-mixed: undo the loss scale first
    if clip_fn is not None:
        norm = clip_fn(module)
        return float("nan") if norm is None else float(norm)
    max_norm = clip if clip is not None else math.inf
    return max((float(nn.utils.clip_grad_norm_(g, max_norm)) for g in groups), default=0.0)


def fit_module(
    module: nn.Module,
    loss_fn: Callable[[nn.Module, Any], LossOut],
    train_batches: Sequence[Any] | Callable[[int], Iterable[Any]],
    *,
    env: TrainEnv = TrainEnv(),
    val_fn: Callable[[nn.Module], float] | None = None,
    optimizer: str | torch.optim.Optimizer = "adam",
    lr: float = 1e-3,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
    param_groups: list[dict] | None = None,
    epochs: int = 1,
    patience: int | None = None,
    min_delta: float = 0.0,
    clip: float | None = 1.0,
    clip_fn: Callable[[nn.Module], float | None] | None = None,
    skip_grad_norm_above: float | None = None,
    on_step: Callable[[int, dict[str, float]], bool] | None = None,
    seed: int = 0,
    log: LogFn | None = None,
    logger: Any = None,
) -> FitResult:
    """Train `module` with `loss_fn` over `train_batches` through Lightning Fabric (see module docstring).

    Args:
        module: any nn.Module (already initialized; build it inside `seeded(seed)` for reproducibility).
            Fabric moves it to env.device (and casts it for "-true" precisions).
        loss_fn: `loss_fn(module, batch) -> loss` or `(loss, metrics)`; metrics (floats) are logged per
            batch; a "batch_size" entry overrides the inferred batch length for `n_seen`. The caller's
            data must live on env.device.
        train_batches: a sequence re-iterated every epoch (same order: shuffle-once protocol), or a
            callable `epoch -> iterable` for per-epoch reshuffling.
        env: device and Lightning precision.
        val_fn: `val_fn(module) -> float`, lower is better; run after every epoch in eval mode without
            gradients. With it the best epoch's state is restored at the end.
        optimizer: "adam" | "adamw" | "sgd" (built over `param_groups` if given, else all parameters
            requiring grad), or a ready torch optimizer over the module's parameters.
        patience: epochs without validation improvement before stopping (None: never stop early).
        clip: max gradient norm, applied to each param group separately (None: no clipping).
        clip_fn: replaces `clip`; `clip_fn(module)` clips in place and may return the pre-clip norm.
        skip_grad_norm_above: skip the optimizer step when the pre-clip norm is non-finite or above this.
        on_step: `on_step(step, metrics) -> stop?` after every optimizer step (online early stopping).
        seed: seeds torch's RNG for the fit (dropout) inside a fork, so global RNG state is untouched.
        log: called once per batch with {"step", "epoch", "n_seen", "loss", "grad_norm", **metrics}.
        logger: optional Lightning logger (CSVLogger, TensorBoardLogger, ...) that receives the same rows.

    Raises:
        ValueError: bad optimizer/epochs/lr/patience. FloatingPointError: non-finite training loss.
    """
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    if patience is not None and patience < 1:
        raise ValueError(f"patience must be >= 1 epoch (or None), got {patience}")
    if isinstance(optimizer, torch.optim.Optimizer):
        opt = optimizer
    else:
        params = (
            param_groups if param_groups is not None else [p for p in module.parameters() if p.requires_grad]
        )
        opt = make_optimizer(params, optimizer, lr, weight_decay, betas)
    fabric = make_fabric(env, loggers=logger)
    net, fopt = fabric.setup(module, opt)
    batches_for = train_batches if callable(train_batches) else (lambda _epoch: train_batches)
    step, n_seen, stopped, epochs_run = 0, 0, False, 0
    best_val, best_epoch, bad, history = None, None, 0, []
    ckpt_dir = tempfile.TemporaryDirectory(prefix="walla-best-") if val_fn is not None else None
    try:
        with seeded(seed, env.device):
            net.train()
            for epoch in range(epochs):
                epochs_run, loss_sum, loss_n = epoch + 1, 0.0, 0
                for batch in batches_for(epoch):
                    fopt.zero_grad(set_to_none=True)
                    out = loss_fn(net, batch)
                    loss, metrics = (out, {}) if isinstance(out, torch.Tensor) else out
                    loss_value = float(loss.detach())
                    if not math.isfinite(loss_value):
                        raise FloatingPointError(f"non-finite training loss {loss_value} at step {step}")
                    fabric.backward(loss)
                    norm = _clip(fabric, net, fopt, clip, clip_fn)
                    skipped = skip_grad_norm_above is not None and not (
                        math.isfinite(norm) and norm <= skip_grad_norm_above
                    )
                    if not skipped:
                        fopt.step()
                    step += 1
                    n_seen += int(metrics.pop("batch_size", _batch_len(batch)))
                    loss_sum, loss_n = loss_sum + loss_value, loss_n + 1
                    row = {"step": step, "epoch": epoch, "n_seen": n_seen, "loss": loss_value}
                    row.update({"grad_norm": norm, **({"skipped": 1.0} if skipped else {}), **metrics})
                    if log is not None:
                        log(row)
                    if logger is not None:
                        fabric.log_dict(
                            {k: v for k, v in row.items() if k not in ("step", "epoch")}, step=step
                        )
                    if on_step is not None and on_step(step, row):
                        stopped = True
                        break
                if stopped:
                    break
                hist = {"epoch": epoch, "train_loss": loss_sum / max(loss_n, 1)}
                history.append(hist)
                if val_fn is None:
                    continue
                net.eval()
                with torch.no_grad():
                    hist["val"] = val = float(val_fn(net))
                net.train()
                if best_val is None or val < best_val - min_delta:
                    best_val, best_epoch, bad = val, epoch, 0
                    fabric.save(Path(ckpt_dir.name) / "best.ckpt", {"module": net})
                else:
                    bad += 1
                if patience is not None and bad >= patience:
                    stopped = True
                    break
        if best_epoch is not None:
            fabric.load(Path(ckpt_dir.name) / "best.ckpt", {"module": net})
    finally:
        if ckpt_dir is not None:
            ckpt_dir.cleanup()
    module.eval()
    return FitResult(
        module=module,
        steps=step,
        epochs_run=epochs_run,
        best_epoch=best_epoch,
        best_val=best_val,
        stopped_early=stopped,
        history=history,
    )
