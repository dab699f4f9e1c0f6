"""Lightning glue: ONE thin wrapper that trains any nn.Module with any loss (STYLE item 7).

    from walla.train.lit import fit_module, seeded, row_batches

    with seeded(seed):                                      # init is the caller's: seed it
        net = MyHead(...)
    batches = row_batches(train_rows, batch_size=100, seed=seed)   # shuffled once (SPEC §3.2)
    res = fit_module(
        net,
        loss_fn=lambda net, rows: ce_of_pool(net(x[rows]), probs[rows], target[rows]),
        train_batches=batches,                  # list of batches, or callable epoch -> iterable
        val_fn=lambda net: val_kl(net),         # optional: per-epoch, lower is better, best restored
        optimizer="adamw", lr=5e-5, weight_decay=0.01, epochs=5, patience=5, clip=1.0,
        seed=seed, log=log,                     # log(dict) once per training batch
    )
    res.module                                  # best (or last) state, in eval mode

Semantics (identical for both engines; `engine="loop"` is a plain for-loop, the default
`engine="lightning"` runs the same step inside `lightning.Trainer` with manual optimization):
    per batch: zero_grad -> loss_fn(module, batch) -> backward -> clip -> (skip if grad norm is
    non-finite or above `skip_grad_norm_above`) -> optimizer.step -> log -> on_step (may stop).
    per epoch (if val_fn): module.eval(), no_grad val_fn(module) -> best state copied on strict
    improvement (by more than min_delta) -> stop after `patience` epochs without one.

Methods without trainable parameters (UniformAvg, SelfCertainty, PackLLM) do not come here.
Methods whose inner loop is batched over seeds/agents pass their own `clip_fn` (per-slice
gradient clipping) and `on_step` (online early stopping); see train/methods/walla.py.
"""

from __future__ import annotations

import copy
import logging
import math
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

LogFn = Callable[[dict[str, float]], None]
LossOut = torch.Tensor | tuple[torch.Tensor, dict[str, float]]
OPTIMIZERS = ("adam", "adamw", "sgd")
ENGINES = ("lightning", "loop")


@dataclass
class FitResult:
    module: nn.Module  # best state if val_fn improved at least once, else the last state
    steps: int  # optimizer steps attempted (skipped ones included)
    epochs_run: int
    best_epoch: int | None  # 0-based epoch whose val was best (None without val_fn)
    best_val: float | None
    stopped_early: bool
    history: list[dict[str, float]] = field(default_factory=list)  # per epoch: epoch, val, train_loss


@contextmanager
def seeded(seed: int, device: str = "cpu") -> Iterator[None]:
    """Run a block with torch's global RNG seeded, restoring the caller's RNG state afterwards.

    Used for module init and dropout so a run never depends on (or disturbs) global RNG state.
    """
    devices = [torch.cuda.current_device()] if device.startswith("cuda") and torch.cuda.is_available() else []
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
    if optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, betas=betas, weight_decay=weight_decay)
    if optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay)
    return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay)


def _batch_len(batch: Any) -> int:
    if isinstance(batch, torch.Tensor | np.ndarray):
        return int(batch.shape[0]) if batch.ndim else 1
    if isinstance(batch, dict) and batch:
        return _batch_len(next(iter(batch.values())))
    if isinstance(batch, list | tuple) and batch:
        return _batch_len(batch[0])
    return 1


def _clip_groups(opt: torch.optim.Optimizer, clip: float | None) -> float:
    """Clip each param group's gradient norm separately; return the largest pre-clip norm."""
    norm = 0.0
    for group in opt.param_groups:
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            continue
        max_norm = clip if clip is not None else float("inf")
        n = torch.nn.utils.clip_grad_norm_(params, max_norm)
        norm = max(norm, float(n))
    return norm


class _Stepper:
    """One training step, shared by both engines so they cannot drift apart."""

    def __init__(self, loss_fn, clip, clip_fn, skip_above, log, on_step):
        self.loss_fn, self.clip, self.clip_fn, self.skip_above = loss_fn, clip, clip_fn, skip_above
        self.log, self.on_step = log, on_step
        self.step, self.n_seen, self.epoch, self.loss_sum, self.loss_n = 0, 0, 0, 0.0, 0
        self.last: dict[str, float] = {}

    def __call__(self, module: nn.Module, opt: torch.optim.Optimizer, batch: Any, backward) -> bool:
        opt.zero_grad(set_to_none=True)
        out = self.loss_fn(module, batch)
        loss, metrics = (out, {}) if isinstance(out, torch.Tensor) else out
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite training loss {float(loss.detach())} at step {self.step}")
        backward(loss)
        if self.clip_fn is not None:
            norm = self.clip_fn(module)
            norm = float("nan") if norm is None else float(norm)
        else:
            norm = _clip_groups(opt, self.clip)
        skipped = self.skip_above is not None and not (math.isfinite(norm) and norm <= self.skip_above)
        if not skipped:
            opt.step()
        self.step += 1
        self.n_seen += int(metrics.pop("batch_size", _batch_len(batch)))
        self.loss_sum, self.loss_n = self.loss_sum + float(loss.detach()), self.loss_n + 1
        row = {
            "step": self.step,
            "epoch": self.epoch,
            "n_seen": self.n_seen,
            "loss": float(loss.detach()),
            "grad_norm": norm,
            **({"skipped": 1.0} if skipped else {}),
            **metrics,
        }
        self.last = row
        if self.log is not None:
            self.log(row)
        return bool(self.on_step(self.step, row)) if self.on_step is not None else False


class _EpochEnd:
    """Per-epoch validation, best-state bookkeeping and patience (shared by both engines)."""

    def __init__(self, val_fn, patience, min_delta):
        self.val_fn, self.patience, self.min_delta = val_fn, patience, min_delta
        self.best_val, self.best_epoch, self.best_state, self.bad = None, None, None, 0
        self.history: list[dict[str, float]] = []

    def __call__(self, module: nn.Module, epoch: int, train_loss: float) -> bool:
        row = {"epoch": epoch, "train_loss": train_loss}
        if self.val_fn is None:
            self.history.append(row)
            return False
        was_training = module.training
        module.eval()
        with torch.no_grad():
            val = float(self.val_fn(module))
        module.train(was_training)
        row["val"] = val
        self.history.append(row)
        if self.best_val is None or val < self.best_val - self.min_delta:
            self.best_val, self.best_epoch, self.bad = val, epoch, 0
            self.best_state = copy.deepcopy(module.state_dict())
        else:
            self.bad += 1
        return self.patience is not None and self.bad >= self.patience


def _quiet_lightning() -> None:
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*GPU available.*")
    warnings.filterwarnings("ignore", message=".*LightningModule.*optimizer.*")
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")  # lightning's own pytree deprecation notice


def _identity(x: Any) -> Any:
    return x


def fit_module(
    module: nn.Module,
    loss_fn: Callable[[nn.Module, Any], LossOut],
    train_batches: Sequence[Any] | Callable[[int], Iterable[Any]],
    *,
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
    logger: Any = "csv",
    log_dir: str | Path | None = None,
    engine: str = "lightning",
    device: str = "cpu",
) -> FitResult:
    """Train `module` with `loss_fn` over `train_batches`; optional per-epoch validation early stopping.

    Args:
        module: any nn.Module (already initialized; build it inside `seeded(seed)` for reproducibility).
        loss_fn: `loss_fn(module, batch) -> loss` or `(loss, metrics)`; metrics (floats) are logged per
            batch; a "batch_size" entry overrides the inferred batch length for `n_seen`.
        train_batches: a sequence re-iterated every epoch (same order: shuffle-once protocol), or a
            callable `epoch -> iterable` for per-epoch reshuffling.
        val_fn: `val_fn(module) -> float`, lower is better; run after every epoch in eval mode without
            gradients. With it the best epoch's state is restored at the end.
        optimizer: "adam" | "adamw" | "sgd" (built over `param_groups` if given, else all parameters
            requiring grad), or a ready torch optimizer.
        patience: epochs without validation improvement before stopping (None: never stop early).
        clip: max gradient norm, applied to each param group separately (None: no clipping).
        clip_fn: replaces `clip`; `clip_fn(module)` clips in place and may return the pre-clip norm
            (e.g. per-agent clipping of a batched module).
        skip_grad_norm_above: skip the optimizer step when the pre-clip norm is non-finite or above this.
        on_step: `on_step(step, metrics) -> stop?` after every optimizer step (online early stopping).
        seed: seeds torch's RNG for the fit (dropout) inside a fork, so global RNG state is untouched.
        log: called once per batch with {"step", "epoch", "n_seen", "loss", "grad_norm", **metrics}.
        logger: "csv" (a Lightning CSVLogger under `log_dir`, only when `log_dir` is given), None/False,
            or any Lightning logger instance (TensorBoard, W&B, ...). Lightning engine only.
        engine: "lightning" (default) or "loop" (same steps in a plain Python loop; no logger).
        device: "cpu" or "cuda"; the module is moved there, batches are the caller's business.

    Returns:
        FitResult with the trained module (best state restored when val_fn is given), in eval mode.

    Raises:
        ValueError: bad optimizer/engine/epochs/lr. FloatingPointError: non-finite training loss.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    if patience is not None and patience < 1:
        raise ValueError(f"patience must be >= 1 epoch (or None), got {patience}")
    module = module.to(device)
    if isinstance(optimizer, torch.optim.Optimizer):
        opt = optimizer
    else:
        params = (
            param_groups if param_groups is not None else [p for p in module.parameters() if p.requires_grad]
        )
        opt = make_optimizer(params, optimizer, lr, weight_decay, betas)
    batches_for = train_batches if callable(train_batches) else (lambda _epoch: train_batches)
    stepper = _Stepper(loss_fn, clip, clip_fn, skip_grad_norm_above, log, on_step)
    epoch_end = _EpochEnd(val_fn, patience, min_delta)

    with seeded(seed, device):
        module.train()
        if engine == "loop":
            stopped, epochs_run = _run_loop(module, opt, batches_for, epochs, stepper, epoch_end)
        else:
            stopped, epochs_run = _run_lightning(
                module, opt, batches_for, epochs, stepper, epoch_end, logger, log_dir, device
            )
    if epoch_end.best_state is not None:
        module.load_state_dict(epoch_end.best_state)
    module.eval()
    return FitResult(
        module=module,
        steps=stepper.step,
        epochs_run=epochs_run,
        best_epoch=epoch_end.best_epoch,
        best_val=epoch_end.best_val,
        stopped_early=stopped,
        history=epoch_end.history,
    )


def _run_loop(module, opt, batches_for, epochs, stepper, epoch_end) -> tuple[bool, int]:
    for epoch in range(epochs):
        stepper.epoch, stepper.loss_sum, stepper.loss_n = epoch, 0.0, 0
        for batch in batches_for(epoch):
            if stepper(module, opt, batch, lambda loss: loss.backward()):
                return True, epoch + 1
        if epoch_end(module, epoch, stepper.loss_sum / max(stepper.loss_n, 1)):
            return True, epoch + 1
    return False, epochs


def _run_lightning(module, opt, batches_for, epochs, stepper, epoch_end, logger, log_dir, device):
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import CSVLogger

    _quiet_lightning()

    class _Wrapper(pl.LightningModule):
        """The one LightningModule: holds the module, runs the shared step with manual optimization."""

        def __init__(self) -> None:
            super().__init__()
            self.net = module
            self.automatic_optimization = False  # custom clipping, skip-steps and online stopping
            self.stopped = False
            self.epochs_started = 0

        def configure_optimizers(self):
            return opt

        def on_train_epoch_start(self) -> None:
            stepper.epoch, stepper.loss_sum, stepper.loss_n = self.current_epoch, 0.0, 0
            self.epochs_started += 1

        def training_step(self, batch, _idx):
            lopt = self.optimizers()
            stop = stepper(self.net, lopt.optimizer, batch, self.manual_backward)
            if self.logger is not None:
                scalars = {k: v for k, v in stepper.last.items() if k not in ("step", "epoch")}
                self.log_dict(scalars, on_step=True, on_epoch=False)
            if stop:
                self.stopped = True
                self.trainer.should_stop = True

        def on_train_epoch_end(self) -> None:
            if self.stopped:
                return
            if epoch_end(self.net, self.current_epoch, stepper.loss_sum / max(stepper.loss_n, 1)):
                self.stopped = True
                self.trainer.should_stop = True

    class _Batches(torch.utils.data.IterableDataset):
        def __init__(self, wrapper: _Wrapper) -> None:
            self.wrapper = wrapper

        def __iter__(self):
            return iter(batches_for(self.wrapper.current_epoch))

    if logger == "csv":
        logger = CSVLogger(save_dir=str(log_dir), name="", version="") if log_dir is not None else False
    elif logger is None:
        logger = False
    wrapper = _Wrapper()
    # own generator: the loader's per-epoch base seed must not consume the global RNG (dropout), so
    # both engines see the same random stream
    loader = torch.utils.data.DataLoader(
        _Batches(wrapper), batch_size=None, collate_fn=_identity, generator=torch.Generator().manual_seed(0)
    )
    trainer = pl.Trainer(
        max_epochs=epochs,
        accelerator="gpu" if device.startswith("cuda") else "cpu",
        devices=1,
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
    )
    trainer.fit(wrapper, loader)
    return wrapper.stopped, wrapper.epochs_started
