"""WALLA's batched, decentralized training loop: every agent of every seed in one StackedHeads.

    cfg = walla.resolve(cfg, data)                               # stop_metric and window filled in
    th = train_heads(data, cfg, seeds=[18, 19], env=TrainEnv(), logs=[None, None])
    th.best, th.last                                  # stacked parameters [G, ...] on the training device

The formulas, per training batch of b questions (train mode, dropout on), agent i (wagers/step.py):
    r_i   = head_i(h_i)                          own last-layer hidden state h_i -> raw score (wagers/heads.py)
    w_i   = sigmoid(r_i / T)                     wager, T = 2, in float64 from the raw score on
    A_i   = s(p_i, y) - b_-i(p_-i, w_-i, y)      realized advantage (mechanism.advantage); b_-i depends only
                                                 on the OTHER agents (I: wager-weighted mean score,
                                                 II: score of their linear pool)
    w*_i  = clip(A_i / 2 c3, 0, 1)               hindsight best response (mechanism.best_response_wager)
    L_i   = mean_b (w_i - w*_i)^2                agent i's own loss; w*_i is a constant for it
    step  : own gradient-norm clip at 1.0, own Adam step
    stop  : D-regret of the pooled aggregate (mechanism.brier_regret; KL(gold || agg) for soft targets,
            mechanism.kl_gold), size-weighted over a rolling window of the last W ~ |val| / 100 batches;
            the state after a batch that improves the window is the best state; patience counts batches
            (SPEC §4.2). One stopping state per seed: the criterion is a property of the ensemble.

Decentralization is exact: all agents of all seeds live in one StackedHeads module (head g = seed
g // (D M), kind (g // M) % D, agent g % M), trained by one Adam over stacked parameters [G, ...]. Adam is
elementwise, the loss is a sum of per-head means, clipping is per head (clipping.clip_gradients, scope
"slice") and dropout masks come from per-seed generators, so each agent follows exactly the trajectory
it would follow trained alone against the same opponents' wagers (tests/train/test_walla_decentralized.py),
and a seed's trajectory does not depend on which seeds share the module.

Lightning Fabric runs the loop (engine.make_fabric): the module and the engine's optimizer (torch's fused
Adam) go through fabric.setup, so `env.device` places every parameter and tensor and `env.precision` applies
(the heads' matmuls under bf16 autocast with "bf16-mixed"; wagers, payouts and metrics stay float64). The
heads are initialised on the device (engine.init_generator, per seed). The best state is a copy of the
improved seed's rows on the same device, taken lazily (wagers/stopping.py): stopping is checked after EVERY
batch, and a disk checkpoint per improvement would cost more than the step itself. Per step the host sends
the batch's indices and dropout masks (device_memory.to_device: asynchronous on CUDA) and reads back one
small tensor of per-seed metrics for stopping and logs and one flag, whether any head's gradient clips
(device_memory.HostRead: both copies queued behind the work that makes them); parameters and best states
never leave the device. The step is queued so that the host waits for the device once, and never while the
device has nothing queued but that wait: forward -> the summary's copy -> backward and per-head norms
(clipping.SliceClip) -> the flag's copy; then the host reads the summary (the device is still in the
backward pass), does the stopping bookkeeping (a best copy, if any, is queued before the step: the
parameters are still the pre-step ones), reads the flag, and queues the clipping and the Adam step. The
order of the arithmetic is the one before issue 31 (two waits per step): the same numbers, bit for bit.

Deliberate deviations from the reference: one forward pass per batch (the reference draws a second
dropout mask for the update); data order shuffled once per seed with numpy's default_rng(seed)
(`shuffle: epoch` reshuffles every epoch); init and dropout seeded.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from walla.train import mechanism
from walla.train.calibration import apply_calibration
from walla.train.engine import (
    HostRead,
    SliceClip,
    TrainEnv,
    init_device,
    init_generator,
    make_fabric,
    make_optimizer,
    to_device,
)
from walla.train.methods import LogFn
from walla.train.wagers._dropout import DropoutMasks
from walla.train.wagers._heads import StackedHeads, stack_hidden
from walla.train.wagers._step import WagerForward, stop_metric, wager_losses
from walla.train.wagers._stopping import OnlineStop

if TYPE_CHECKING:  # the method module imports this one
    from walla.train.methods.walla import Config


@dataclass
class TrainedHeads:
    """Result of train_heads for a group of seeds (head g = seed g // A, kind (g % A) // M, agent g % M)."""

    cfg: Config
    seeds: list[int]
    in_dims: list[int]  # [M] real hidden size per agent
    n_kinds: int  # 1 (wager) or 3 (wager, own-score, baseline diagnostics)
    last: list[torch.Tensor]  # StackedHeads parameters after the last step (heads on axis 0), on the device
    best: list[torch.Tensor]  # restored state (best window metric; last if none), on the device
    best_step: list[int | None]  # per seed
    stop_step: list[int | None]  # per seed: step at which patience ran out (None: ran all epochs)
    steps: int


@dataclass(frozen=True)
class _Layout:
    """How the G = S * D * M heads of the module map to seeds, head kinds and agents."""

    n_seeds: int  # S
    n_kinds: int  # D: 1 (wager) or 3 (wager, own-score, baseline diagnostics)
    n_agents: int  # M

    @property
    def per_seed(self) -> int:
        return self.n_kinds * self.n_agents

    @property
    def n_heads(self) -> int:
        return self.n_seeds * self.per_seed


@dataclass
class _TrainRows:
    """The training rows' tensors on the training device."""

    probs: torch.Tensor  # [n, M, K] float64 (calibrated when WALLA is)
    target: torch.Tensor  # [n, K] float64
    option_mask: torch.Tensor  # [n, K] bool
    bank: torch.Tensor  # [M, n, Hmax] hidden states (standardized when cfg.standardize)


def hidden_stats(data, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-agent mean and std [M, Hmax] of each agent's OWN hidden states on `rows` (padding: 0 / 1).

    Decentralized: agent i's statistics come from its own features only. Small models' last-layer
    states have norms in the tens to thousands; standardised inputs keep the heads' first steps (and so
    the wagers) from saturating the sigmoid at demo-sized learning rates.
    """
    hmax = max(int(h.shape[1]) for h in data.hidden)
    mean = torch.zeros(len(data.hidden), hmax)
    std = torch.ones(len(data.hidden), hmax)
    for i, h in enumerate(data.hidden):
        x = np.asarray(h[rows], dtype=np.float64)  # [n, H_i]
        mean[i, : x.shape[1]] = torch.from_numpy(x.mean(0))
        std[i, : x.shape[1]] = torch.from_numpy(np.maximum(x.std(0), 1e-6))
    return mean, std


def init_heads(
    seeds: Sequence[int], in_dims: list[int], cfg: Config, n_kinds: int, device: str | torch.device = "cpu"
) -> StackedHeads:
    """nn.Linear default init per head, drawn on `device` from a generator seeded with the head's seed.

    On the CPU these are the values `with seeded(seed): WagerHead(...)` draws (engine.init_generator).
    Per seed: the wager heads of agents 0..M-1 first, then the diagnostic heads, so wager-head init does
    not depend on `diagnostics`; each seed has its own generator, so its init does not depend on the
    other seeds of the module.
    """
    per_seed = n_kinds * len(in_dims)
    dims = in_dims * (n_kinds * len(seeds))
    heads = StackedHeads(dims, cfg.hidden, cfg.dropout, cfg.projection_dim, init=False, device=device)
    for s, seed in enumerate(seeds):
        gen = init_generator(seed, device)
        for g in range(s * per_seed, (s + 1) * per_seed):
            heads.init_head_(g, gen)
    return heads


def _train_rows(data, cfg: Config, rows: np.ndarray, dev, env: TrainEnv, calibration) -> _TrainRows:
    if calibration is not None:
        probs = apply_calibration(calibration, data, rows, env)
    else:
        probs = data.probs[rows]
    bank = stack_hidden(data.hidden, rows, dev)  # [M, n, Hmax]
    if cfg.standardize:
        mean, std = (t.to(dev) for t in hidden_stats(data, rows))
        bank = (bank.float() - mean[:, None]) / std[:, None]  # [M, n, Hmax] float32 (fp16 would lose digits)
    return _TrainRows(
        probs=torch.as_tensor(np.asarray(probs), dtype=torch.float64, device=dev),
        target=torch.as_tensor(np.asarray(data.target[rows]), dtype=torch.float64, device=dev),
        option_mask=torch.as_tensor(np.asarray(data.option_mask[rows], dtype=bool), device=dev),
        bank=bank,
    )


def _dropout(seeds: Sequence[int], layout: _Layout, cfg: Config, device) -> DropoutMasks:
    """Keep-masks from per-seed numpy generators (train/wagers/_dropout.py: drawn in threads, a step ahead).

    PCG64 draws ~1.5x faster than torch's CPU generator. Diagnostic heads draw from their own
    generators, so the wager heads see the same masks whether or not diagnostics are on.
    """
    gens, rows, m = [], [], layout.n_agents
    for s, seed in enumerate(seeds):
        first = s * layout.per_seed
        gens.append(np.random.default_rng([seed, 1]))  # wager heads
        rows.append(slice(first, first + m))
        if layout.n_kinds > 1:
            gens.append(np.random.default_rng([seed, 2]))  # diagnostic heads
            rows.append(slice(first + m, first + layout.per_seed))
    return DropoutMasks(gens, rows, cfg.hidden, 1 - cfg.dropout, device)


class _Order:
    """Each seed's order of the training positions.

    One permutation per seed (numpy default_rng(seed)), reused every epoch, or redrawn every epoch with
    `shuffle: epoch`.
    """

    def __init__(self, seeds: Sequence[int], n: int, cfg: Config, device) -> None:
        self.rngs = [np.random.default_rng(seed) for seed in seeds]
        self.n, self.batch_size, self.device = n, cfg.batch_size, device
        self.reshuffle = cfg.shuffle == "epoch"
        self.orders = self._draw()  # [S, n]

    def _draw(self) -> np.ndarray:
        return np.stack([r.permutation(self.n) for r in self.rngs])

    def sizes(self) -> list[int]:
        """The batch sizes of one epoch, in order."""
        bs = self.batch_size
        return [min(bs, self.n - t * bs) for t in range(math.ceil(self.n / bs))]

    def batches(self, epoch: int):
        """Per batch the positions of every seed, [S, b] on the training device."""
        if self.reshuffle and epoch > 0:
            self.orders = self._draw()
        bs = self.batch_size
        for t in range(math.ceil(self.n / bs)):
            yield to_device(self.orders[:, t * bs : (t + 1) * bs], self.device)


class _WagerTraining:
    """The module, optimizer and stopping state of one train_heads call, and its training step."""

    def __init__(self, fabric, heads: StackedHeads, rows: _TrainRows, cfg: Config, layout: _Layout, stop):
        opt = make_optimizer(heads.parameters(), "adam", cfg.lr, device=str(fabric.device))
        # Adam is elementwise: one optimizer over the stacked parameters = one Adam per head
        self.net, self.opt = fabric.setup(heads, opt)
        self.fabric, self.heads, self.rows = fabric, heads, rows
        self.cfg, self.layout, self.stop = cfg, layout, stop

    def _inputs(self, idx: torch.Tensor) -> torch.Tensor:
        """Each head's own hidden states of the batch: [G, b, Hmax]."""
        s_n, n_kinds, m = self.layout.n_seeds, self.layout.n_kinds, self.layout.n_agents
        b = idx.shape[1]
        x = self.rows.bank[:, idx].transpose(0, 1)  # [S, M, b, H]
        if n_kinds > 1:
            x = x.unsqueeze(1).expand(s_n, n_kinds, m, b, x.shape[-1])  # [S, D, M, b, H]
        return x.reshape(self.layout.n_heads, b, -1).to(self.heads.weights[0].dtype)  # [G, b, H]

    def forward(self, idx: torch.Tensor, masks: list[torch.Tensor] | None) -> WagerForward:
        s_n, n_kinds, m = self.layout.n_seeds, self.layout.n_kinds, self.layout.n_agents
        r = self.net(self._inputs(idx), masks).double().view(s_n, n_kinds, m, idx.shape[1])  # float64
        return wager_losses(r, self.rows.probs[idx], self.rows.target[idx], self.cfg)

    @torch.no_grad()
    def summary(self, fw: WagerForward, idx: torch.Tensor) -> HostRead:
        """The batch's per-seed numbers for stopping and logs (pre-update aggregate), on their way to the host."""
        cfg = self.cfg
        mask = self.rows.option_mask[idx]
        agg = mechanism.pool(fw.p, fw.wagers, cfg.pooling, option_mask=mask, validate=False)  # [S, b, K]
        metric = None
        if cfg.stop_metric != "none":
            metric = stop_metric(cfg.stop_metric, agg, fw.p, fw.y).mean(1)  # [S]
        payout = mechanism.payout(fw.wagers, fw.adv, cfg.c3)  # the advantage of this step, not recomputed
        summary = {
            "mse": fw.mse.detach(),
            "metric": metric,
            "wager": fw.wagers.mean(1),
            "adv": fw.adv.mean(1),
            "payout": payout.mean(1),
        }
        return HostRead({k: v for k, v in summary.items() if v is not None})  # one transfer, queued

    def account(self, read: HostRead, b: int, step: int, epoch: int) -> bool:
        """Online early stopping on the batch's summary (before the update: the lazy best copy)."""
        summary = read.result()
        payout_mean = summary.pop("payout")
        return self.stop.update(step, epoch, b, summary, payout_mean)

    def backward(self, loss: torch.Tensor) -> tuple[SliceClip, HostRead]:
        """Backward and each head's pre-clip norm and clip coefficient, queued (no wait); the clip flag's read."""
        self.opt.zero_grad(set_to_none=True)
        self.fabric.backward(loss)
        clip = SliceClip(self.fabric, self.opt, self.cfg.clip)
        return clip, HostRead({"clips": clip.clips})

    def update(self, clip: SliceClip, flag: HostRead) -> None:
        """Per-head clipping (when any head clips) and one Adam step over every head."""
        clip.apply_(bool(flag.result()["clips"]))
        self.opt.step()


def _check_data(data, rows: np.ndarray, cfg: Config) -> None:
    if data.n_agents < 2:
        raise ValueError(
            f"WALLA needs >= 2 agents (a leave-one-out baseline), scenario {data.name!r} has {data.n_agents}"
        )
    if len(rows) == 0:
        raise ValueError(f"scenario {data.name!r} has no 'train' rows to fit WALLA on")
    if cfg.stop_metric == "auto" or cfg.window is None:
        raise ValueError("train_heads needs a resolved Config (walla.resolve: stop_metric and window)")


def train_heads(
    data,
    cfg: Config,
    seeds: Sequence[int],
    env: TrainEnv = TrainEnv(),
    logs: Sequence[LogFn | None] | None = None,
    calibration: dict | None = None,
    trace: Callable[[dict], None] | None = None,
    initial: Sequence[list[torch.Tensor] | None] | None = None,
) -> TrainedHeads:
    """Train the wager heads of every agent for every seed as one batched module (module docstring).

    `cfg` must be resolved (walla.resolve). `initial`: per seed, stacked parameters to continue from
    (train/join.py) or None. `trace` (test hook) is called per step with the pre-update {"idx" [S, b],
    "wagers" [S, b, M], "masks" list of [G, b, w]}.

    Raises:
        ValueError: fewer than 2 agents, no training rows, or an unresolved cfg.
    """
    seeds = [int(s) for s in seeds]
    train = data.split_index("train")
    _check_data(data, train, cfg)
    fabric = make_fabric(env)
    dev = fabric.device
    layout = _Layout(len(seeds), 3 if cfg.diagnostics else 1, data.n_agents)
    in_dims = [int(h.shape[1]) for h in data.hidden]
    heads = init_heads(seeds, in_dims, cfg, layout.n_kinds, init_device(dev))
    for j, params in enumerate(initial or []):  # continue from trained heads, per seed
        if params is not None:
            heads.load_rows(slice(j * layout.per_seed, (j + 1) * layout.per_seed), params)
    stop = OnlineStop(cfg, heads, layout.n_seeds, layout.per_seed, logs)
    rows = _train_rows(data, cfg, train, dev, env, calibration)
    training = _WagerTraining(fabric, heads, rows, cfg, layout, stop)
    dropout = _dropout(seeds, layout, cfg, dev) if cfg.dropout > 0 else None
    order = _Order(seeds, len(train), cfg, dev)
    sizes = order.sizes()
    step = 0
    training.net.train()
    try:
        for epoch in range(cfg.epochs):
            for t, idx in enumerate(order.batches(epoch)):
                masks = None
                if dropout is not None:  # the next step's masks are drawn while this one computes
                    more = t + 1 < len(sizes) or epoch + 1 < cfg.epochs
                    masks = dropout.take(idx.shape[1], sizes[(t + 1) % len(sizes)] if more else None)
                fw = training.forward(idx, masks)
                step += 1
                if trace is not None:
                    cpu_masks = [mk.cpu() for mk in masks] if masks else None
                    trace({"idx": idx.cpu(), "wagers": fw.wagers.cpu(), "masks": cpu_masks})
                summary = training.summary(fw, idx)  # queued behind the forward pass
                clip, flag = training.backward(fw.loss)  # queued: the device works while the host reads
                done = training.account(summary, idx.shape[1], step, epoch)  # may copy best rows (pre-step)
                training.update(clip, flag)  # the step's one wait: the clip flag
                if done:
                    break
            if stop.done:
                break
    finally:
        if dropout is not None:
            dropout.close()
    last = [p.detach() for p in heads.parameters()]  # the module is not used again: no copy
    best = stop.best_or_last(last)
    return TrainedHeads(cfg, seeds, in_dims, layout.n_kinds, last, best, stop.best_step, stop.stop_step, step)
