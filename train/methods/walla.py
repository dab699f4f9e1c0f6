"""WALLA I / II: decentralized wager heads trained from realized advantages (paper §3.3; SPEC §4-§5).

    states = fit_many(data, {"variant": "I"}, seeds=[18, 19, 20, 21, 22])   # all seeds, one module
    out = predict(states[0], data, data.split_index("test"))               # weights, agg_probs, extras

Per agent i a head on i's OWN last-layer hidden state outputs r_i; its wager is w_i = sigmoid(r_i / T)
(T = 2). Per training batch (batch 100, train mode, dropout on):
    1. every agent wagers; the platform (train/mechanism.py) pays each agent its realized advantage
       A_i = s_i - b_-i (variant I: wager-weighted mean of the others' scores; II: score of the others'
       linear pool), where b_-i depends only on the OTHER agents' predictions and wagers;
    2. agent i regresses its wager onto the hindsight best response w*_i = clip(A_i / 2c3, 0, 1)
       (MSE; own Adam; own gradient-norm clipping at 1.0), the target being a constant for it;
    3. the aggregate (normalized wagers, linear or log pool) is scored on the batch for ONLINE early
       stopping: Brier dynamic regret (KL(gold || aggregate) for soft-target data), size-weighted over a
       rolling window of the last W ~ |val| / 100 training batches; the state after the update of a
       batch that improves the window metric is kept as best; patience counts batches (SPEC §4.2).

Decentralization is exact: nothing reaches agent i's parameters except its own hidden states and its
own realized advantage. All agents of all seeds live in one StackedHeads module (row g = head g of
seed s), trained by one Adam over stacked parameters [G, ...]: Adam is elementwise, the loss is a sum
of per-head means, gradient clipping is per head, dropout masks come from per-seed generators. So each agent's
trajectory is exactly the one it would follow trained alone against the same sequence of opponents'
wagers (tests/train/test_walla_decentralized.py checks this against a plain nn.Module + its own Adam),
and each seed's trajectory is independent of which other seeds share the module.

Early stopping: the criterion is the aggregate's regret, a property of the whole ensemble of a seed,
so there is ONE stopping state per seed (as in the reference), not one per agent. A stopped seed keeps
computing in the batched module (cheaper than re-packing), but its best state is frozen and its log ends.

Deviations from the reference, all deliberate: one forward pass per batch (the reference runs a second
forward with a fresh dropout mask for the update; here the early-stopping metric and the target use the
same pre-update wagers); the per-agent projection Linear(H -> 4096) is off by default
(`projection_dim: 4096` restores it; SPEC §5.1 note); data order is shuffled once per seed with numpy's
default_rng(seed) (`shuffle: epoch` reshuffles every epoch); init and dropout are seeded.

Engine: the inner loop runs through walla.train.lit.fit_module, either as a plain loop (default) or
inside Lightning (`engine: lightning`; same steps, bit-identical parameters, tested). Measured on the
2-core CPU (benchmarks/train_speed.py, 12 agents x 5 seeds, H = 576): ~13-15 s for both engines, the
per-step difference within run-to-run noise, ~30 ms more per fit for Lightning's Trainer; but importing
Lightning alone takes 3-10 s on that machine, which a WALLA-only run would pay for nothing. Hence the
plain loop by default. Against the reference's per-agent loop (same head, same FLOPs minus one forward)
the batched module measured 1.8x faster on a quiet CPU and 17x on a CPU shared with other jobs: it
removes per-agent Python/kernel-launch overhead and uses one fused Adam step, but the weight-gradient
matmuls of 60 heads x 576 x 512 are the same work either way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from walla.train import mechanism
from walla.train.calibration import CalibrationState, apply_calibration, fit_calibration
from walla.train.config import WallaConfig
from walla.train.heads import StackedHeads, WagerHead, stack_hidden
from walla.train.lit import fit_module, seeded
from walla.train.methods import LogFn, MethodOutput

PARAM_BUDGET_BYTES = 3 * 2**30  # params + grad + Adam moments + best copy of one seed chunk


def resolve(data, cfg: dict | None) -> dict:
    """The fully resolved config for this scenario (preset applied): what run.json records."""
    return _config(data, cfg).to_dict()


def _config(data, cfg: dict | WallaConfig | None) -> WallaConfig:
    c = cfg if isinstance(cfg, WallaConfig) else WallaConfig.from_dict(cfg)
    return c.resolved(bool(data.soft_target), list(data.agents), len(data.split_index("val")))


@dataclass
class TrainedHeads:
    """Result of train_heads for a group of seeds (head g = seed g // A, kind (g % A) // M, agent g % M)."""

    cfg: WallaConfig
    seeds: list[int]
    in_dims: list[int]  # [M] real hidden size per agent
    n_kinds: int  # 1 (wager) or 3 (wager, own-score, baseline diagnostics)
    last: list[torch.Tensor]  # StackedHeads parameters after the last step (heads on axis 0)
    best: list[torch.Tensor]  # restored state (best window metric; last if none)
    best_step: list[int | None]  # per seed
    stop_step: list[int | None]  # per seed: step at which patience ran out (None: ran all epochs)
    steps: int
    calibration: CalibrationState | None


def _draw_masks(
    gens: list[np.random.Generator],
    diag_gens: list[np.random.Generator],
    m: int,
    n_kinds: int,
    b: int,
    widths: Sequence[int],
    keep: float,
) -> list[torch.Tensor]:
    """Dropout keep-masks, one [G, b, width] per hidden layer, from per-seed generators.

    numpy's PCG64 draws uniforms ~1.5x faster than torch's CPU generator (masks are ~10% of a step).
    Diagnostic heads draw from their own per-seed generators, so the wager heads see the same masks
    (and hence the same trajectory) whether or not diagnostics are on.
    """
    out = []
    for w in widths:
        parts = []
        for g, dg in zip(gens, diag_gens, strict=True):
            parts.append(g.random((m, b, w), dtype=np.float32) < keep)  # [M, b, w]
            if n_kinds > 1:
                parts.append(dg.random(((n_kinds - 1) * m, b, w), dtype=np.float32) < keep)
        out.append(torch.from_numpy(np.concatenate(parts).astype(np.float32)))  # [G, b, w]
    return out


def _init_heads(seeds: Sequence[int], in_dims: list[int], cfg: WallaConfig, n_kinds: int) -> StackedHeads:
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


def _stop_metric(kind: str, agg: torch.Tensor, probs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-row early-stopping metric (lower is better). agg [..., K], probs [..., M, K], target [..., K]."""
    if kind == "kl":  # KL(gold || aggregate), SPEC §8 validation form
        return (target * ((target + 1e-10).log() - agg.clamp_min(1e-10).log())).sum(-1)
    # Brier dynamic regret: Brier(aggregate) - min_i Brier(p_i) (unhalved, expected under soft targets)
    return (
        mechanism.brier_loss(agg, target) - mechanism.brier_loss(probs, target.unsqueeze(-2)).min(-1).values
    )


def train_heads(
    data,
    cfg: dict | WallaConfig | None,
    seeds: Sequence[int],
    logs: Sequence[LogFn | None] | None = None,
    calibration: CalibrationState | None = None,
    trace: Callable[[dict], None] | None = None,
) -> TrainedHeads:
    """Train the wager heads of every agent for every seed as one batched module (see module docstring).

    Args:
        data: ScenarioData (training uses data.split_index("train") only; |val| sets the window).
        cfg: WALLA config (dict or WallaConfig), resolved here against `data`.
        seeds: seeds trained together; each seeds its own init, dropout and data order.
        logs: optional per-seed LogFn, called once per training batch until that seed stops.
        calibration: a fitted CalibrationState to reuse (else fitted here when cfg.calibrated).
        trace: test hook, called per step with {"idx" [S, b] train positions, "wagers" [S, b, M],
            "masks" list of [G, b, w]} (the pre-update quantities of that step).

    Raises:
        ValueError: bad config, no training rows, or a scenario with fewer than 2 agents.
    """
    cfg = _config(data, cfg)
    seeds = [int(s) for s in seeds]
    m = data.n_agents
    if m < 2:
        raise ValueError(
            f"WALLA needs >= 2 agents (a leave-one-out baseline), scenario {data.name!r} has {m}"
        )
    train = data.split_index("train")
    if len(train) == 0:
        raise ValueError(f"scenario {data.name!r} has no 'train' rows to fit WALLA on")
    device = torch.device(cfg.device)
    if cfg.calibrated and calibration is None:
        calibration = fit_calibration(data, cfg.calibration, device=cfg.device)
    probs_np = apply_calibration(calibration, data, train) if cfg.calibrated else data.probs[train]
    probs = torch.from_numpy(np.asarray(probs_np, dtype=np.float32)).to(device)  # [n, M, K]
    target = torch.from_numpy(np.asarray(data.target[train], dtype=np.float32)).to(device)  # [n, K]
    option_mask = torch.from_numpy(np.asarray(data.option_mask[train], dtype=bool)).to(device)  # [n, K]
    bank = stack_hidden(data.hidden, train).to(device)  # [M, n, Hmax]
    in_dims = [int(h.shape[1]) for h in data.hidden]
    n_kinds = 3 if cfg.diagnostics else 1
    s_n, a_n = len(seeds), n_kinds * m
    g_n = s_n * a_n

    heads = _init_heads(seeds, in_dims, cfg, n_kinds).to(device)
    gens = [np.random.default_rng([seed, 1]) for seed in seeds]  # wager-head dropout, per seed
    diag_gens = [np.random.default_rng([seed, 2]) for seed in seeds]  # diagnostic heads' dropout
    rngs = [np.random.default_rng(seed) for seed in seeds]  # data order, per seed
    n, bs = len(train), cfg.batch_size
    n_batches = math.ceil(n / bs)
    orders = np.stack([r.permutation(n) for r in rngs])  # [S, n] train positions

    def batches_for(epoch: int) -> list[tuple[int, int]]:
        nonlocal orders
        if cfg.shuffle == "epoch" and epoch > 0:
            orders = np.stack([r.permutation(n) for r in rngs])
        return [(epoch, t) for t in range(n_batches)]

    keep = 1.0 - cfg.dropout
    widths = list(cfg.hidden)
    step_out: dict = {}

    def loss_fn(module: StackedHeads, batch: tuple[int, int]):
        _, t = batch
        idx = torch.from_numpy(orders[:, t * bs : (t + 1) * bs]).to(device)  # [S, b]
        b = idx.shape[1]
        x = bank[:, idx].transpose(0, 1)  # [S, M, b, H]
        if n_kinds > 1:
            x = x.unsqueeze(1).expand(s_n, n_kinds, m, b, x.shape[-1])  # [S, D, M, b, H]
        x = x.reshape(g_n, b, -1).float()  # [G, b, H]
        masks = _draw_masks(gens, diag_gens, m, n_kinds, b, widths, keep) if cfg.dropout > 0 else None
        masks = [mk.to(device) for mk in masks] if masks is not None else None
        r = module(x, masks).view(s_n, n_kinds, m, b)  # [S, D, M, b]
        w = torch.sigmoid(r[:, 0] / cfg.temperature).transpose(1, 2)  # [S, b, M] wagers
        p, y = probs[idx], target[idx]  # [S, b, M, K], [S, b, K]
        with torch.no_grad():
            wd = w.detach()
            adv = mechanism.advantage(p, wd, y, cfg.variant, cfg.c1, cfg.c2, validate=False)  # [S, b, M]
            w_star = mechanism.best_response_wager(adv, cfg.c3, w_max=1.0)  # [S, b, M]
        mse = ((w - w_star) ** 2).mean(1)  # [S, M]: agent i's own loss
        loss = mse.sum()
        if n_kinds > 1:  # diagnostic heads: own score and baseline, never used for wagers
            with torch.no_grad():
                score = cfg.c1 - cfg.c2 * mechanism.brier_loss(p, y.unsqueeze(-2))  # [S, b, M]
                base = score - adv
            pred_s = torch.sigmoid(r[:, 1]).transpose(1, 2)  # [S, b, M]
            pred_b = torch.sigmoid(r[:, 2]).transpose(1, 2)
            loss = (
                loss
                + ((pred_s - score.clamp(0, 1)) ** 2).mean(1).sum()
                + ((pred_b - base.clamp(0, 1)) ** 2).mean(1).sum()
            )
        with torch.no_grad():
            agg = mechanism.pool(
                p, wd, cfg.pooling, option_mask=option_mask[idx], validate=False
            )  # [S, b, K]
            metric = _stop_metric(cfg.stop_metric, agg, p, y).mean(1) if cfg.stop_metric != "none" else None
            step_out.update(  # per-seed summaries, on the CPU for the bookkeeping below
                b=b,
                mse=mse.detach().mean(1).cpu(),
                metric=metric.cpu() if metric is not None else None,
                wager=wd.mean(1).cpu(),
                adv=adv.mean(1).cpu(),
                payout=(wd * (adv - cfg.c3 * wd)).mean(1).cpu(),
            )
        if trace is not None:
            trace(
                {"idx": idx.cpu(), "wagers": wd.cpu(), "masks": [mk.cpu() for mk in masks] if masks else None}
            )
        return loss, {"batch_size": b}

    # ---- per-seed online early stopping (SPEC §4.2) -----------------------------------------------
    win = int(cfg.window)
    ring = torch.zeros(win, s_n, dtype=torch.float64)  # batch metric * batch size
    ring_n = torch.zeros(win, dtype=torch.float64)
    filled = 0
    best_val = torch.full((s_n,), math.inf, dtype=torch.float64)
    bad = torch.zeros(s_n, dtype=torch.long)
    active = [True] * s_n
    best = [p.detach().clone() for p in heads.parameters()]
    best_step: list[int | None] = [None] * s_n
    stop_step: list[int | None] = [None] * s_n
    n_seen = 0
    logs = list(logs) if logs is not None else [None] * s_n

    def on_step(step: int, row: dict) -> bool:
        nonlocal filled, n_seen
        b = step_out["b"]
        n_seen += b
        wm = torch.full((s_n,), math.nan, dtype=torch.float64)
        if step_out["metric"] is not None:
            ring[(step - 1) % win] = step_out["metric"].double() * b
            ring_n[(step - 1) % win] = b
            filled = min(filled + 1, win)
            if filled == win:
                wm = ring.sum(0) / ring_n.sum()  # [S] size-weighted window mean
                for s in range(s_n):
                    if not active[s]:
                        continue
                    if wm[s] < best_val[s]:
                        best_val[s], bad[s], best_step[s] = wm[s], 0, step
                        rows = slice(s * a_n, (s + 1) * a_n)
                        for bp, p in zip(best, heads.parameters(), strict=True):
                            bp[rows] = p.detach()[rows]  # state AFTER this batch's update
                    else:
                        bad[s] += 1
        for s in range(s_n):
            if not active[s]:
                continue
            if logs[s] is not None:
                entry = {
                    "step": step,
                    "epoch": row["epoch"],
                    "n_seen": n_seen,
                    "loss": float(step_out["mse"][s]),
                    "stop_metric": float(step_out["metric"][s])
                    if step_out["metric"] is not None
                    else math.nan,
                    "window_metric": float(wm[s]),
                    "wager_mean": float(step_out["wager"][s].mean()),
                    "advantage_mean": float(step_out["adv"][s].mean()),
                    "payout_mean": float(step_out["payout"][s].mean()),
                }
                entry.update({f"wager_{i}": float(v) for i, v in enumerate(step_out["wager"][s].tolist())})
                entry.update({f"advantage_{i}": float(v) for i, v in enumerate(step_out["adv"][s].tolist())})
                logs[s](entry)
            if bad[s] >= cfg.patience:
                active[s], stop_step[s] = False, step
        return not any(active)

    # Adam is elementwise, so one optimizer over the stacked parameters = one Adam per head; the fused
    # CPU/GPU kernel does each step in one pass over the parameters (the step dominates at H ~ 600)
    fused = {"fused": True} if device.type in ("cpu", "cuda") else {}
    opt = torch.optim.Adam(heads.parameters(), lr=cfg.lr, **fused)
    res = fit_module(
        heads,
        loss_fn,
        batches_for,
        optimizer=opt,
        lr=cfg.lr,
        epochs=cfg.epochs,
        clip_fn=lambda mod: float(mod.clip_per_head_(cfg.clip).max()),
        on_step=on_step,
        seed=seeds[0],
        engine=cfg.engine,
        logger=None,
        device=cfg.device,
    )
    last = [p.detach().clone() for p in heads.parameters()]
    for s in range(s_n):  # a seed whose window never improved keeps its last state
        if best_step[s] is None:
            rows = slice(s * a_n, (s + 1) * a_n)
            for bp, lp in zip(best, last, strict=True):
                bp[rows] = lp[rows]
    return TrainedHeads(
        cfg=cfg,
        seeds=seeds,
        in_dims=in_dims,
        n_kinds=n_kinds,
        last=[t.cpu() for t in last],
        best=[t.cpu() for t in best],
        best_step=best_step,
        stop_step=stop_step,
        steps=res.steps,
        calibration=calibration,
    )


def _seed_chunks(data, cfg: WallaConfig, seeds: list[int]) -> list[list[int]]:
    """Seeds per batched module so that parameters + grads + Adam moments + best copy fit the budget."""
    heads = StackedHeads(
        [max(int(h.shape[1]) for h in data.hidden)], cfg.hidden, cfg.dropout, cfg.projection_dim, init=False
    )
    per_seed = (
        sum(p.numel() for p in heads.parameters()) * data.n_agents * (3 if cfg.diagnostics else 1) * 4 * 6
    )
    k = max(1, int(PARAM_BUDGET_BYTES // per_seed))
    return [seeds[i : i + k] for i in range(0, len(seeds), k)]


def fit_many(
    data, cfg: dict | None, seeds: Sequence[int], logs: Sequence[LogFn | None] | None = None
) -> list[dict]:
    """Fit one state per seed, all seeds batched in one module (chunked if memory demands it)."""
    c = _config(data, cfg)
    seeds = [int(s) for s in seeds]
    logs = list(logs) if logs is not None else [None] * len(seeds)
    calibration = fit_calibration(data, c.calibration, device=c.device) if c.calibrated else None
    states = []
    for chunk in _seed_chunks(data, c, seeds):
        chunk_logs = [logs[seeds.index(s)] for s in chunk]
        th = train_heads(data, c, chunk, chunk_logs, calibration=calibration)
        a_n = th.n_kinds * data.n_agents
        for j, seed in enumerate(chunk):
            states.append(
                {
                    "cfg": c.to_dict(),
                    "seed": seed,
                    "in_dims": th.in_dims,
                    "n_kinds": th.n_kinds,
                    "params": [t[j * a_n : (j + 1) * a_n].clone() for t in th.best],
                    "best_step": th.best_step[j],
                    "stop_step": th.stop_step[j],
                    "steps": th.steps,
                    "calibration": calibration,
                }
            )
    return states


def fit(data, cfg: dict | None, seed: int, log: LogFn | None = None) -> dict:
    """Fit the wager heads of every agent for one seed (see fit_many)."""
    return fit_many(data, cfg, [seed], [log])[0]


def predict(state: dict, data, rows: np.ndarray, chunk: int = 2048) -> MethodOutput:
    """Eval-mode wagers (no dropout) -> weights, pooled prediction, payouts/advantages for `rows`."""
    cfg = WallaConfig.from_dict(state["cfg"])
    rows = np.asarray(rows, dtype=np.int64)
    m, n_kinds = data.n_agents, state["n_kinds"]
    if len(state["in_dims"]) != m:
        raise ValueError(f"state was trained with {len(state['in_dims'])} agents, scenario has {m}")
    heads = StackedHeads(state["in_dims"] * n_kinds, cfg.hidden, cfg.dropout, cfg.projection_dim, init=False)
    heads.load_rows(slice(None), state["params"])
    heads.eval()
    cal = state.get("calibration")
    probs_np = (
        apply_calibration(cal, data, rows) if cal is not None else np.asarray(data.probs[rows], np.float32)
    )
    raw = []
    with torch.no_grad():
        for start in range(0, len(rows), chunk):
            part = rows[start : start + chunk]
            x = stack_hidden(data.hidden, part)  # [M, n, H]
            x = x.unsqueeze(0).expand(n_kinds, *x.shape).reshape(n_kinds * m, len(part), -1).float()
            raw.append(heads(x))  # [D*M, n]
    r = torch.cat(raw, dim=1) if raw else torch.zeros(n_kinds * m, 0)
    w = torch.sigmoid(r[:m] / cfg.temperature).T.contiguous()  # [n, M]
    p = torch.from_numpy(probs_np)  # [n, M, K]
    y = torch.from_numpy(np.asarray(data.target[rows], dtype=np.float32))  # [n, K]
    mask = torch.from_numpy(np.asarray(data.option_mask[rows], dtype=bool))  # [n, K]
    agg = mechanism.pool(p, w, cfg.pooling, option_mask=mask)  # [n, K]
    adv = mechanism.advantage(p, w, y, cfg.variant, cfg.c1, cfg.c2, validate=False)  # [n, M]
    total = w.sum(1, keepdim=True)
    weights = torch.where(total > 0, w / total.clamp_min(1e-30), torch.full_like(w, 1.0 / m))  # [n, M]
    extras = {
        "wagers": w.numpy().astype(np.float32),
        "advantage": adv.numpy().astype(np.float32),
        "payouts": (w * (adv - cfg.c3 * w)).numpy().astype(np.float32),
    }
    if n_kinds > 1:
        extras["pred_score"] = torch.sigmoid(r[m : 2 * m]).T.numpy().astype(np.float32)
        extras["pred_baseline"] = torch.sigmoid(r[2 * m : 3 * m]).T.numpy().astype(np.float32)
    if cal is not None:
        extras["agent_probs"] = probs_np.astype(np.float32)
    return MethodOutput(
        weights=weights.numpy().astype(np.float32), agg_probs=agg.numpy().astype(np.float32), extras=extras
    )
