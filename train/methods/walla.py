"""WALLA I / II: decentralized wager heads trained from realized advantages (paper §3.3; SPEC §4-§5).

    states = fit(data, Config(variant="I"), seeds=[18, 19], env=TrainEnv(), logs=[None, None])
    out = predict(states[0], data, data.split_index("test"), TrainEnv())   # weights, agg_probs, extras

The formulas, per training batch of b questions (batch 100, train mode, dropout on), agent i:
    r_i   = head_i(h_i)                          own last-layer hidden state h_i -> raw score (heads.py)
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
elementwise, the loss is a sum of per-head means, clipping is per head and dropout masks come from
per-seed generators, so each agent follows exactly the trajectory it would follow trained alone against
the same opponents' wagers (tests/train/test_walla_decentralized.py), and a seed's trajectory does not
depend on which seeds share the module.

Lightning Fabric runs the loop (walla.train.engine.make_fabric): the module and optimizer go through
fabric.setup, so `env.device` places every parameter and tensor and `env.precision` applies (the heads'
matmuls under bf16 autocast with "bf16-mixed"; wagers, payouts and metrics stay float64). The best state
is an in-memory copy of the improved seed's rows, taken lazily (online_stop.py): stopping is checked after
EVERY batch, and a disk checkpoint per improvement would cost more than the step itself. Gradients are
written into persistent .grad buffers (StackedHeads write_grads: no 0.5 GB allocation per step); bf16-mixed
on the CPU keeps float32 masters and bf16 gradients and updates them in one pass (mixed_adam.MasterAdam).

Deliberate deviations from the reference: one forward pass per batch (the reference draws a second
dropout mask for the update); data order shuffled once per seed with numpy's default_rng(seed)
(`shuffle: epoch` reshuffles every epoch); init and dropout seeded. `projection_dim: 4096` (default) is
the reference's Linear(H -> 4096) projection; `null` drops it (same function class, different Adam
dynamics: it learns slower at the reference's learning rates, issue 10).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from walla.manifests.validate import check, config, to_dict
from walla.train import mechanism
from walla.train.calibration import CalibrationConfig, apply_calibration, fit_calibration
from walla.train.engine import TrainEnv, make_fabric, seeded
from walla.train.heads import StackedHeads, WagerHead, stack_hidden
from walla.train.methods import LogFn, MethodOutput
from walla.train.mixed_adam import stacked_adam
from walla.train.online_stop import OnlineStop

PARAM_BUDGET_BYTES = 3 * 2**30  # params + grad + Adam moments + best copy of one seed chunk


@config
class Config:
    """WALLA hyper-parameters (SPEC §4.4 heterogeneous defaults; presets are the scenario YAML's)."""

    variant: str = "I"  # "I": weighted-score baseline | "II": weighted-prediction baseline
    pooling: str = "linear"  # aggregate: linear | log (variant II's peer pool stays linear)
    lr: float = 5e-7  # Adam
    epochs: int = 50
    patience: int = 10_000  # training batches without window improvement
    batch_size: int = 100
    temperature: float = 2.0  # wager = sigmoid(r / T)
    clip: float = 1.0  # per-agent gradient-norm clipping
    hidden: tuple[int, ...] = (512, 256)
    dropout: float = 0.1
    projection_dim: int | None = 4096  # the reference's per-agent Linear(H -> 4096); null: none
    standardize: bool = (
        False  # per-agent standardisation of its own hidden states (mean/std of its train rows)
    )
    c1: float = 1.0  # score s = c1 - c2 * Brier
    c2: float = 0.5
    c3: float = 0.5  # payout w (s - b - c3 w); target w* = clip((s - b) / 2c3, 0, 1)
    stop_metric: str = "auto"  # auto (kl for soft targets, else brier_regret) | brier_regret | kl | none
    window: int | None = None  # rolling window (batches); None = max(1, round(|val| / batch_size))
    shuffle: str = "once"  # training order: "once" per seed (SPEC §3.2) | "epoch"
    diagnostics: bool = False  # extra heads predicting own score and baseline (never used for wagers)
    calibrated: bool = False  # adaptive temperature heads before everything (SPEC §9)
    calibration: CalibrationConfig = CalibrationConfig()

    def __post_init__(self) -> None:
        check(self.variant in mechanism.VARIANTS, "variant", "'I' or 'II'", self.variant)
        check(self.pooling in mechanism.POOL_KINDS, "pooling", "'linear' or 'log'", self.pooling)
        check(self.lr > 0, "lr", "> 0", self.lr)
        check(self.epochs >= 1, "epochs", ">= 1", self.epochs)
        check(self.patience >= 1, "patience", ">= 1 batch", self.patience)
        check(self.batch_size >= 1, "batch_size", ">= 1", self.batch_size)
        check(self.temperature > 0, "temperature", "> 0", self.temperature)
        check(self.clip > 0, "clip", "> 0", self.clip)
        check(0 <= self.dropout < 1, "dropout", "in [0, 1)", self.dropout)
        check(
            len(self.hidden) >= 1 and min(self.hidden) >= 1,
            "hidden",
            "a non-empty list of sizes",
            self.hidden,
        )
        check(
            self.projection_dim is None or self.projection_dim >= 1,
            "projection_dim",
            ">= 1 or null",
            self.projection_dim,
        )
        check(self.c2 > 0 and self.c3 > 0, "c2 and c3", "> 0", (self.c2, self.c3))
        stops = ("auto", "brier_regret", "kl", "none")
        check(self.stop_metric in stops, "stop_metric", " | ".join(stops), self.stop_metric)
        check(self.window is None or self.window >= 1, "window", ">= 1 batch or null", self.window)
        check(self.shuffle in ("once", "epoch"), "shuffle", "'once' or 'epoch'", self.shuffle)


def resolve(cfg: Config, data) -> Config:
    """Fill the data-dependent fields (stop_metric auto, window null): what run.json records."""
    soft = bool(data.soft_target)
    stop = cfg.stop_metric if cfg.stop_metric != "auto" else ("kl" if soft else "brier_regret")
    window = (
        cfg.window if cfg.window is not None else max(1, round(len(data.split_index("val")) / cfg.batch_size))
    )
    return replace(cfg, stop_metric=stop, window=window)


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


@dataclass
class TrainedHeads:
    """Result of train_heads for a group of seeds (head g = seed g // A, kind (g % A) // M, agent g % M)."""

    cfg: Config
    seeds: list[int]
    in_dims: list[int]  # [M] real hidden size per agent
    n_kinds: int  # 1 (wager) or 3 (wager, own-score, baseline diagnostics)
    last: list[torch.Tensor]  # StackedHeads parameters after the last step (heads on axis 0), CPU
    best: list[torch.Tensor]  # restored state (best window metric; last if none), CPU
    best_step: list[int | None]  # per seed
    stop_step: list[int | None]  # per seed: step at which patience ran out (None: ran all epochs)
    steps: int


def _init_heads(seeds: Sequence[int], in_dims: list[int], cfg: Config, n_kinds: int) -> StackedHeads:
    """nn.Linear default init per head under seeded(seed): wager heads of agents 0..M-1 first, then the
    diagnostic heads, so wager-head init does not depend on `diagnostics`."""
    m = len(in_dims)
    heads = StackedHeads(
        in_dims * (n_kinds * len(seeds)), cfg.hidden, cfg.dropout, cfg.projection_dim, init=False
    )
    for s, seed in enumerate(seeds):
        with seeded(seed):
            for k in range(n_kinds):
                for i, d in enumerate(in_dims):
                    heads.load_head(
                        (s * n_kinds + k) * m + i, WagerHead(d, cfg.hidden, cfg.dropout, cfg.projection_dim)
                    )
    return heads


def _masks(
    gens, diag_gens, m: int, n_kinds: int, b: int, widths: Sequence[int], keep: float
) -> list[torch.Tensor]:
    """Dropout keep-masks, one [G, b, width] per hidden layer, from per-seed numpy generators (PCG64 draws
    ~1.5x faster than torch's CPU generator). Diagnostic heads draw from their own generators, so the
    wager heads see the same masks whether or not diagnostics are on."""
    out = []
    for w in widths:
        parts = []
        for g, dg in zip(gens, diag_gens, strict=True):
            parts.append(g.random((m, b, w), dtype=np.float32) < keep)  # [M, b, w]
            if n_kinds > 1:
                parts.append(dg.random(((n_kinds - 1) * m, b, w), dtype=np.float32) < keep)
        out.append(torch.from_numpy(np.concatenate(parts)))  # [G, b, w] bool
    return out


def _stop_metric(kind: str, agg: torch.Tensor, probs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-question early-stopping metric (lower is better): the mechanism's one D-regret / KL."""
    return mechanism.kl_gold(target, agg) if kind == "kl" else mechanism.brier_regret(agg, probs, target)


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

    `trace` (test hook) is called per step with the pre-update {"idx" [S, b], "wagers" [S, b, M],
    "masks" list of [G, b, w]}. Raises ValueError: fewer than 2 agents, or no training rows.
    """
    cfg, seeds, m = resolve(cfg, data), [int(s) for s in seeds], data.n_agents
    if m < 2:
        raise ValueError(
            f"WALLA needs >= 2 agents (a leave-one-out baseline), scenario {data.name!r} has {m}"
        )
    train = data.split_index("train")
    if len(train) == 0:
        raise ValueError(f"scenario {data.name!r} has no 'train' rows to fit WALLA on")
    fabric = make_fabric(env)
    dev = fabric.device
    probs_np = (
        apply_calibration(calibration, data, train, env) if calibration is not None else data.probs[train]
    )
    probs = torch.as_tensor(np.asarray(probs_np), dtype=torch.float64, device=dev)  # [n, M, K]
    target = torch.as_tensor(np.asarray(data.target[train]), dtype=torch.float64, device=dev)  # [n, K]
    option_mask = torch.as_tensor(np.asarray(data.option_mask[train], dtype=bool), device=dev)  # [n, K]
    bank = stack_hidden(data.hidden, train).to(dev)  # [M, n, Hmax]
    if cfg.standardize:
        mean, std = (t.to(dev) for t in hidden_stats(data, train))
        bank = (bank.float() - mean[:, None]) / std[:, None]  # [M, n, Hmax] float32 (fp16 would lose digits)
    in_dims = [int(h.shape[1]) for h in data.hidden]
    n_kinds = 3 if cfg.diagnostics else 1
    s_n, a_n = len(seeds), n_kinds * m
    g_n = s_n * a_n
    heads = _init_heads(seeds, in_dims, cfg, n_kinds)
    for j, params in enumerate(initial or []):  # continue from trained heads (train/join.py), per seed
        if params is not None:
            heads.load_rows(slice(j * a_n, (j + 1) * a_n), params)
    # Adam is elementwise: one optimizer over the stacked parameters = one Adam per head, in one pass over
    # them per step (memory-bound at 4096 wide): torch's fused Adam, or bf16-mixed on the CPU mixed_adam's
    net, opt = fabric.setup(heads, stacked_adam(heads, cfg.lr, env.precision, dev))
    gens = [np.random.default_rng([seed, 1]) for seed in seeds]  # wager-head dropout, per seed
    diag_gens = [np.random.default_rng([seed, 2]) for seed in seeds]  # diagnostic heads' dropout
    rngs = [np.random.default_rng(seed) for seed in seeds]  # data order, per seed
    n, bs = len(train), cfg.batch_size
    orders = np.stack([r.permutation(n) for r in rngs])  # [S, n] train positions
    stop = OnlineStop(cfg, heads, s_n, a_n, logs)
    step = 0
    net.train()
    for epoch in range(cfg.epochs):
        if cfg.shuffle == "epoch" and epoch > 0:
            orders = np.stack([r.permutation(n) for r in rngs])
        for t in range(math.ceil(n / bs)):
            idx = torch.from_numpy(orders[:, t * bs : (t + 1) * bs]).to(dev)  # [S, b]
            b = idx.shape[1]
            x = bank[:, idx].transpose(0, 1)  # [S, M, b, H]
            if n_kinds > 1:
                x = x.unsqueeze(1).expand(s_n, n_kinds, m, b, x.shape[-1])  # [S, D, M, b, H]
            x = x.reshape(g_n, b, -1).to(heads.weights[0].dtype)  # [G, b, H]
            masks = None
            if cfg.dropout > 0:
                masks = [
                    mk.to(dev) for mk in _masks(gens, diag_gens, m, n_kinds, b, cfg.hidden, 1 - cfg.dropout)
                ]
            # ---- forward: wagers, realized advantages, best-response targets -------------------------
            r = net(x, masks, write_grads=True).double().view(s_n, n_kinds, m, b)  # [S, D, M, b] float64
            w = torch.sigmoid(r[:, 0] / cfg.temperature).transpose(1, 2)  # [S, b, M] wagers
            p, y, wd = probs[idx], target[idx], w.detach()  # [S, b, M, K], [S, b, K], [S, b, M]
            adv = mechanism.advantage(p, wd, y, cfg.variant, cfg.c1, cfg.c2, validate=False)  # [S, b, M]
            w_star = mechanism.best_response_wager(adv, cfg.c3, w_max=1.0)  # [S, b, M]
            mse = ((w - w_star) ** 2).mean(1)  # [S, M]: agent i's own loss
            loss = mse.sum()
            if n_kinds > 1:  # diagnostic heads: own score and baseline, never used for wagers
                score = mechanism.brier_score(p, y.unsqueeze(-2), cfg.c1, cfg.c2, validate=False)  # [S, b, M]
                for k, goal in ((1, score), (2, score - adv)):
                    pred = torch.sigmoid(r[:, k]).transpose(1, 2)  # [S, b, M]
                    loss = loss + ((pred - goal.clamp(0, 1)) ** 2).mean(1).sum()
            step += 1
            # ---- online early stopping on the pre-update aggregate (before the update: lazy best copy)
            with torch.no_grad():
                agg = mechanism.pool(p, wd, cfg.pooling, option_mask=option_mask[idx], validate=False)
                stop_on = cfg.stop_metric != "none"  # agg [S, b, K]; metric [S]
                metric = _stop_metric(cfg.stop_metric, agg, p, y).mean(1) if stop_on else None
                payout = mechanism.payout(wd, adv, cfg.c3)  # the advantage of this step, not recomputed
            if trace is not None:
                cpu_masks = [mk.cpu() for mk in masks] if masks else None
                trace({"idx": idx.cpu(), "wagers": wd.cpu(), "masks": cpu_masks})
            summary = {"mse": mse.detach(), "metric": metric, "wager": wd.mean(1), "adv": adv.mean(1)}
            summary = {k: v.cpu() for k, v in summary.items() if v is not None}
            done = stop.update(step, epoch, b, summary, payout.mean(1).cpu())
            # ---- update: gradients written in place (no zero_grad), per-head clipping, one Adam step --
            fabric.backward(loss)
            fabric.strategy.precision.unscale_gradients(opt.optimizer)  # 16-mixed only
            heads.clip_per_head_(cfg.clip)
            opt.step()
            if done:
                break
        if stop.done:
            break
    last = [p.detach().cpu() for p in heads.parameters()]  # the module is not used again: no copy
    best = stop.best_or_last(last)
    return TrainedHeads(cfg, seeds, in_dims, n_kinds, last, best, stop.best_step, stop.stop_step, step)


def _seed_chunks(data, cfg: Config, seeds: list[int]) -> list[list[int]]:
    """Seeds per batched module so that parameters + grads + Adam moments + best copy fit the budget."""
    h_max = max(int(h.shape[1]) for h in data.hidden)
    heads = StackedHeads([h_max], cfg.hidden, cfg.dropout, cfg.projection_dim, init=False)
    per_seed = (
        sum(p.numel() for p in heads.parameters()) * data.n_agents * (3 if cfg.diagnostics else 1) * 4 * 6
    )
    k = max(1, int(PARAM_BUDGET_BYTES // per_seed))
    return [seeds[i : i + k] for i in range(0, len(seeds), k)]


def fit(
    data,
    cfg: Config,
    seeds: Sequence[int],
    env: TrainEnv,
    logs: Sequence[LogFn | None],
    initial: Sequence[list[torch.Tensor] | None] | None = None,
) -> list[dict]:
    """One state per seed, all seeds batched in one module (chunked if memory demands it)."""
    cfg, seeds = resolve(cfg, data), [int(s) for s in seeds]
    logs = list(logs) if logs is not None else [None] * len(seeds)
    calibration = fit_calibration(data, cfg.calibration, env) if cfg.calibrated else None
    states = []
    for chunk in _seed_chunks(data, cfg, seeds):
        init = [initial[seeds.index(s)] for s in chunk] if initial is not None else None
        th = train_heads(
            data, cfg, chunk, env, [logs[seeds.index(s)] for s in chunk], calibration, initial=init
        )
        a_n = th.n_kinds * data.n_agents
        for j, seed in enumerate(chunk):
            states.append(
                {
                    "cfg": to_dict(cfg),
                    "seed": seed,
                    "in_dims": th.in_dims,
                    "n_kinds": th.n_kinds,
                    "params": [
                        t[j * a_n : (j + 1) * a_n].clone() for t in th.best
                    ],  # head = kind * M + agent
                    "best_step": th.best_step[j],
                    "stop_step": th.stop_step[j],
                    "steps": th.steps,
                    "calibration": calibration,
                    "hidden_stats": hidden_stats(data, data.split_index("train"))
                    if cfg.standardize
                    else None,
                }
            )
    return states


def predict(state: dict, data, rows: np.ndarray, env: TrainEnv, chunk: int = 2048) -> MethodOutput:
    """Eval-mode wagers (no dropout) -> weights, pooled prediction, payouts/advantages for `rows`.

    Wagers are float64 from the raw score on, through pooling, advantages and the returned arrays."""
    cfg = Config(**{**state["cfg"], "calibration": CalibrationConfig(**state["cfg"]["calibration"])})
    rows = np.asarray(rows, dtype=np.int64)
    m, n_kinds, dev = data.n_agents, state["n_kinds"], torch.device(env.device)
    if len(state["in_dims"]) != m:
        raise ValueError(f"state was trained with {len(state['in_dims'])} agents, scenario has {m}")
    dims = state["in_dims"] * n_kinds
    heads = StackedHeads(dims, cfg.hidden, cfg.dropout, cfg.projection_dim, init=False, device=dev).eval()
    heads.load_rows(slice(None), state["params"])
    cal = state.get("calibration")
    probs_np = apply_calibration(cal, data, rows, env) if cal is not None else np.asarray(data.probs[rows])
    raw = []
    with torch.no_grad():
        for start in range(0, len(rows), chunk):
            part = rows[start : start + chunk]
            x = stack_hidden(data.hidden, part).to(dev)  # [M, n, H]
            if state.get("hidden_stats") is not None:
                mean, std = (t.to(dev) for t in state["hidden_stats"])
                x = (x.float() - mean[:, None]) / std[:, None]
            x = x.unsqueeze(0).expand(n_kinds, *x.shape).reshape(n_kinds * m, len(part), -1).float()
            raw.append(heads.predict(x).double())  # [D*M, n]
    r = torch.cat(raw, dim=1) if raw else torch.zeros(n_kinds * m, 0, dtype=torch.float64, device=dev)
    w = torch.sigmoid(r[:m] / cfg.temperature).T.contiguous()  # [n, M] float64
    p = torch.as_tensor(probs_np, dtype=torch.float64, device=dev)  # [n, M, K]
    y = torch.as_tensor(np.asarray(data.target[rows]), dtype=torch.float64, device=dev)  # [n, K]
    mask = torch.as_tensor(np.asarray(data.option_mask[rows], dtype=bool), device=dev)  # [n, K]
    agg = mechanism.pool(p, w, cfg.pooling, option_mask=mask)  # [n, K]
    adv = mechanism.advantage(p, w, y, cfg.variant, cfg.c1, cfg.c2, validate=False)  # [n, M]
    weights = mechanism.pool_weights(w)  # [n, M], rows sum to 1
    extras = {"wagers": w, "advantage": adv, "payouts": mechanism.payout(w, adv, cfg.c3)}
    if n_kinds > 1:
        extras["pred_score"] = torch.sigmoid(r[m : 2 * m]).T
        extras["pred_baseline"] = torch.sigmoid(r[2 * m : 3 * m]).T
    extras = {k: v.cpu().numpy() for k, v in extras.items()}
    if cal is not None:
        extras["agent_probs"] = np.asarray(probs_np, dtype=np.float32)
    return MethodOutput(weights=weights.cpu().numpy(), agg_probs=agg.cpu().numpy(), extras=extras)
