"""The generic training loop: one module, one loss, one optimizer, driven by Lightning Fabric.

    from walla.train.engine._loop import fit_module

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
precision's autocast / dtype conversion) -> fabric.backward -> clipping.clip_gradients in `clip_scope`
-> the loss and the largest gradient norm read back in one transfer (a non-finite loss raises) -> skip the
step if the gradient norm is non-finite or above `skip_grad_norm_above` -> optimizer.step -> log ->
on_step (may stop).
Per epoch (if val_fn): eval mode, no_grad val_fn(module) -> on strict improvement (by more than
min_delta) the module's state is copied (a clone on its own device: no host or disk round trip) -> stop
after `patience` epochs without one; the best copy is loaded back at the end.

StackedGen (all seeds as one module, clip_scope "slice") and the routers use it; WALLA's batched heads
and the calibration heads run their own loops on the same engine pieces (wagers/training.py,
calibration/temperature.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from walla.train.engine._clipping import clip_gradients
from walla.train.engine._fabric import TrainEnv, make_fabric, make_optimizer, seeded
from walla.train.engine._memory import to_host
from walla.train.methods import LogFn

LossOut = torch.Tensor | tuple[torch.Tensor, dict[str, float]]
# on_step(step, row, grad_norms) -> stop?; grad_norms are clipping.clip_gradients' pre-clip norms
StepHook = Callable[[int, dict[str, float], torch.Tensor], bool]


@dataclass
class FitResult:
    module: nn.Module  # best state if val_fn improved at least once, else the last state
    steps: int  # optimizer steps attempted (skipped ones included)
    epochs_run: int
    best_epoch: int | None  # 0-based epoch whose val was best (None without val_fn)
    best_val: float | None
    stopped_early: bool
    history: list[dict[str, float]] = field(default_factory=list)  # per epoch: epoch, val, train_loss


@dataclass
class _StepRules:
    """What every training step does besides forward and backward (fit_module's arguments)."""

    clip: float | None
    clip_scope: str
    skip_grad_norm_above: float | None
    on_step: StepHook | None
    log: LogFn | None
    logger: Any


def _batch_len(batch: Any) -> int:
    if isinstance(batch, torch.Tensor | np.ndarray):
        return int(batch.shape[0]) if batch.ndim else 1
    if isinstance(batch, dict) and batch:
        return _batch_len(next(iter(batch.values())))
    if isinstance(batch, list | tuple) and batch:
        return _batch_len(batch[0])
    return 1


class _Training:
    """The step and epoch counters of one fit and its per-batch step."""

    def __init__(self, fabric, net: nn.Module, opt, loss_fn, rules: _StepRules) -> None:
        self.fabric, self.net, self.opt, self.loss_fn, self.rules = fabric, net, opt, loss_fn, rules
        self.step, self.n_seen = 0, 0

    def train_step(self, batch: Any, epoch: int) -> tuple[float, bool]:
        """One optimizer step on `batch`: (its loss, whether on_step asked to stop)."""
        rules = self.rules
        self.opt.zero_grad(set_to_none=True)
        out = self.loss_fn(self.net, batch)
        loss, metrics = (out, {}) if isinstance(out, torch.Tensor) else out
        self.fabric.backward(loss)
        norms = clip_gradients(self.fabric, self.opt, rules.clip, rules.clip_scope)
        loss_value, norm = _read_back(loss, norms)
        if not math.isfinite(loss_value):
            raise FloatingPointError(f"non-finite training loss {loss_value} at step {self.step}")
        limit = rules.skip_grad_norm_above
        skipped = limit is not None and not (math.isfinite(norm) and norm <= limit)
        if not skipped:
            self.opt.step()
        self.step += 1
        self.n_seen += int(metrics.pop("batch_size", _batch_len(batch)))
        row = {"step": self.step, "epoch": epoch, "n_seen": self.n_seen, "loss": loss_value}
        row.update({"grad_norm": norm, **({"skipped": 1.0} if skipped else {}), **metrics})
        self._log(row)
        stop = rules.on_step is not None and rules.on_step(self.step, row, norms)
        return loss_value, bool(stop)

    def _log(self, row: dict[str, float]) -> None:
        if self.rules.log is not None:
            self.rules.log(row)
        if self.rules.logger is not None:
            metrics = {k: v for k, v in row.items() if k not in ("step", "epoch")}
            self.fabric.log_dict(metrics, step=self.step)

    def train_epoch(self, batches: Iterable[Any], epoch: int) -> tuple[dict[str, float], bool]:
        """Every batch of one epoch: ({"epoch", "train_loss"}, whether on_step asked to stop)."""
        loss_sum, loss_n = 0.0, 0
        for batch in batches:
            loss, stop = self.train_step(batch, epoch)
            loss_sum, loss_n = loss_sum + loss, loss_n + 1
            if stop:
                return {}, True
        return {"epoch": epoch, "train_loss": loss_sum / max(loss_n, 1)}, False


def _read_back(loss: torch.Tensor, norms: torch.Tensor) -> tuple[float, float]:
    """(the loss, the largest pre-clip norm, 0 without any) as floats, in one device-to-host transfer."""
    back = {"loss": loss.detach()}
    if norms.numel():
        back["norm"] = norms.max()
    back = to_host(back)
    return float(back["loss"]), float(back["norm"]) if "norm" in back else 0.0


class _BestCheckpoint:
    """Validation after each epoch; the best state kept as a copy on the module's device, loaded at the end."""

    def __init__(self, fabric, net: nn.Module, val_fn, patience: int | None, min_delta: float) -> None:
        self.fabric, self.net, self.val_fn = fabric, net, val_fn
        self.patience, self.min_delta = patience, min_delta
        self.best_val: float | None = None
        self.best_epoch: int | None = None
        self.bad = 0
        self.best_state: dict[str, torch.Tensor] | None = None

    def after_epoch(self, epoch: int, hist: dict[str, float]) -> bool:
        """Validate (recorded in `hist`); checkpoint on strict improvement. True: patience ran out."""
        self.net.eval()
        with torch.no_grad():
            hist["val"] = val = float(self.val_fn(self.net))
        self.net.train()
        if self.best_val is None or val < self.best_val - self.min_delta:
            self.best_val, self.best_epoch, self.bad = val, epoch, 0
            self.best_state = {k: v.detach().clone() for k, v in self.net.state_dict().items()}
        else:
            self.bad += 1
        return self.patience is not None and self.bad >= self.patience

    def restore(self) -> None:
        if self.best_state is not None:
            self.net.load_state_dict(self.best_state)


def _check_fit_args(epochs: int, patience: int | None) -> None:
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    if patience is not None and patience < 1:
        raise ValueError(f"patience must be >= 1 epoch (or None), got {patience}")


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
    clip_scope: str = "group",
    skip_grad_norm_above: float | None = None,
    on_step: StepHook | None = None,
    seed: int = 0,
    log: LogFn | None = None,
    logger: Any = None,
) -> FitResult:
    """Train `module` with `loss_fn` over `train_batches` through Lightning Fabric (module docstring).

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
        optimizer: "adam" | "adamw" | "sgd" (engine.make_optimizer over `param_groups` if given, else
            all parameters requiring grad), or a ready torch optimizer over the module's parameters.
        patience: epochs without validation improvement before stopping (None: never stop early).
        clip: max gradient norm (None: no clipping), in `clip_scope` (clipping.clip_gradients): "group"
            each param group alone, "all" jointly, "slice" each slice along axis 0 of each group.
        skip_grad_norm_above: skip the optimizer step when the pre-clip norm is non-finite or above this.
        on_step: `on_step(step, row, grad_norms) -> stop?` after every optimizer step (online early
            stopping); grad_norms: the pre-clip norms, [n_groups] or [n_groups, S] for "slice".
        seed: seeds torch's RNG for the fit (dropout) inside a fork, so global RNG state is untouched.
        log: called once per batch with {"step", "epoch", "n_seen", "loss", "grad_norm", **metrics};
            grad_norm is the largest pre-clip norm.
        logger: optional Lightning logger (CSVLogger, TensorBoardLogger, ...) that receives the same rows.

    Raises:
        ValueError: bad optimizer/epochs/lr/patience/clip_scope. FloatingPointError: non-finite loss.
    """
    _check_fit_args(epochs, patience)
    if isinstance(optimizer, torch.optim.Optimizer):
        opt = optimizer
    else:
        trainable = [p for p in module.parameters() if p.requires_grad]
        params = param_groups if param_groups is not None else trainable
        opt = make_optimizer(params, optimizer, lr, weight_decay, betas, env.device)
    fabric = make_fabric(env, loggers=logger)
    net, fopt = fabric.setup(module, opt)
    rules = _StepRules(clip, clip_scope, skip_grad_norm_above, on_step, log, logger)
    training = _Training(fabric, net, fopt, loss_fn, rules)
    best = _BestCheckpoint(fabric, net, val_fn, patience, min_delta) if val_fn is not None else None
    batches_for = train_batches if callable(train_batches) else (lambda _epoch: train_batches)
    history, stopped, epochs_run = [], False, 0
    with seeded(seed, env.device):
        net.train()
        for epoch in range(epochs):
            epochs_run = epoch + 1
            hist, stopped = training.train_epoch(batches_for(epoch), epoch)
            if stopped:
                break
            history.append(hist)
            if best is not None and best.after_epoch(epoch, hist):
                stopped = True
                break
    if best is not None:
        best.restore()
    module.eval()
    return FitResult(
        module=module,
        steps=training.step,
        epochs_run=epochs_run,
        best_epoch=best.best_epoch if best is not None else None,
        best_val=best.best_val if best is not None else None,
        stopped_early=stopped,
        history=history,
    )
