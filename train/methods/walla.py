"""WALLA I / II: decentralized wager heads trained from realized advantages (paper §3.3; SPEC §4-§5).

    states = fit(data, Config(variant="I"), seeds=[18, 19], env=TrainEnv(), logs=[None, None])
    out = predict(states[0], data, data.split_index("test"), TrainEnv())   # weights, agg_probs, extras

Each agent's head reads only its own last-layer hidden state and learns to wager its hindsight best
response to its realized advantage over the others; the training loop (all agents of all seeds as one
batched module, exactly decentralized) is train/wagers/_training.py. This module is the method's surface:
its hyper-parameters, the data-dependent ones filled in (`resolve`), seeds chunked to a memory budget
(device_memory.seeds_per_chunk: a share of the free memory on CUDA, so a GPU fits every seed at once; a fixed
host budget on the CPU), one state per seed (its tensors on the training device until saved), and
eval-mode predictions (weights = normalized wagers, the pooled forecast, payouts and advantages).

`projection_dim: 4096` (default) is the reference's Linear(H -> 4096) projection; `null` drops it (same
function class, different Adam dynamics: it learns slower at the reference's learning rates, issue 10).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace

import numpy as np
import torch
from walla.manifests.validate import check, config, to_dict
from walla.train import mechanism
from walla.train.calibration import CalibrationConfig, apply_calibration, fit_calibration
from walla.train.engine import TrainEnv, free_device_bytes, seeds_per_chunk
from walla.train.methods import LogFn, MethodOutput
from walla.train.wagers import StackedHeads, hidden_stats, stack_hidden, train_heads

# float32 copies of every parameter a chunk holds: parameter, gradient, two Adam moments, best copy, spare
# (the states handed back, on the training device)
COPIES_PER_PARAM = 6
# on a device, activation bytes per head and batch row: per layer width, the output, its gradient and (after
# ReLU) the mask and the dropped copy
ACTIVATION_COPIES = 4


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
    # per-agent standardisation of its own hidden states (mean/std of its train rows)
    standardize: bool = False
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
    window = cfg.window
    if window is None:
        window = max(1, round(len(data.split_index("val")) / cfg.batch_size))
    return replace(cfg, stop_metric=stop, window=window)


def seed_bytes(data, cfg: Config, on_device: bool, value_bytes: int = 4) -> int:
    """Memory one seed's heads take in a batched fit: COPIES_PER_PARAM copies of its parameters (float32:
    `value_bytes` 4), plus its activations on a device (the host budget, PARAM_BUDGET_BYTES, is sized for
    float32 parameters only)."""
    dims = [max(int(h.shape[1]) for h in data.hidden)]
    dims += ([cfg.projection_dim] if cfg.projection_dim else []) + list(cfg.hidden) + [1]
    per_head = sum(a * b + b for a, b in zip(dims[:-1], dims[1:], strict=True))
    heads = data.n_agents * (3 if cfg.diagnostics else 1)
    act = cfg.batch_size * sum(dims) * value_bytes * ACTIVATION_COPIES if on_device else 0
    return heads * (per_head * value_bytes * COPIES_PER_PARAM + act)


def _seed_chunks(data, cfg: Config, seeds: list[int], env: TrainEnv = TrainEnv()) -> Iterator[list[int]]:
    """Seeds per batched module so that every copy of their heads fits the memory budget (module docstring).

    On a device the free memory is read before each chunk, since the states of earlier chunks stay there,
    and "64-true" counts 8 bytes a value.
    """
    start = 0
    while start < len(seeds):
        free = free_device_bytes(env.device)
        value_bytes = 8 if free is not None and env.precision == "64-true" else 4
        k = seeds_per_chunk(seed_bytes(data, cfg, free is not None, value_bytes), free)
        yield seeds[start : start + k]
        start += k


def fit(
    data,
    cfg: Config,
    seeds: Sequence[int],
    env: TrainEnv,
    logs: Sequence[LogFn | None],
    initial: Sequence[list[torch.Tensor] | None] | None = None,
) -> list[dict]:
    """One state per seed, all seeds batched in one module (chunked if memory demands it).

    `initial`: per seed, stacked head parameters to continue from (train/join.py) or None.
    """
    cfg, seeds = resolve(cfg, data), [int(s) for s in seeds]
    logs = list(logs) if logs is not None else [None] * len(seeds)
    calibration = fit_calibration(data, cfg.calibration, env) if cfg.calibrated else None
    stats = hidden_stats(data, data.split_index("train")) if cfg.standardize else None
    states = []
    for chunk in _seed_chunks(data, cfg, seeds, env):
        pos = [seeds.index(s) for s in chunk]
        init = [initial[i] for i in pos] if initial is not None else None
        th = train_heads(data, cfg, chunk, env, [logs[i] for i in pos], calibration, initial=init)
        per_seed = th.n_kinds * data.n_agents
        for j, seed in enumerate(chunk):
            states.append(
                {
                    "cfg": to_dict(cfg),
                    "seed": seed,
                    "in_dims": th.in_dims,
                    "n_kinds": th.n_kinds,
                    # stacked parameters of this seed's heads: head = kind * M + agent
                    "params": [t[j * per_seed : (j + 1) * per_seed].clone() for t in th.best],
                    "best_step": th.best_step[j],
                    "stop_step": th.stop_step[j],
                    "steps": th.steps,
                    # the seeds batched in this seed's fit: on CUDA the chunking follows the free memory,
                    # and a seed fit in another batch is equal only to float rounding
                    "fit_with_seeds": list(chunk),
                    "calibration": calibration,
                    "hidden_stats": stats,
                }
            )
        del th  # the chunk's module and best copy: free before the next chunk measures its memory
    return states


def _raw_scores(state: dict, heads: StackedHeads, data, rows: np.ndarray, dev, chunk: int) -> torch.Tensor:
    """Eval-mode raw scores of every head on `rows`, in chunks: [D*M, n] float64."""
    m, n_kinds = data.n_agents, state["n_kinds"]
    raw = []
    with torch.no_grad():
        for start in range(0, len(rows), chunk):
            part = rows[start : start + chunk]
            x = stack_hidden(data.hidden, part, dev)  # [M, n, H]
            if state.get("hidden_stats") is not None:
                mean, std = (t.to(dev) for t in state["hidden_stats"])
                x = (x.float() - mean[:, None]) / std[:, None]
            x = x.unsqueeze(0).expand(n_kinds, *x.shape).reshape(n_kinds * m, len(part), -1).float()
            raw.append(heads.predict(x).double())  # [D*M, n]
    if not raw:
        return torch.zeros(n_kinds * m, 0, dtype=torch.float64, device=dev)
    return torch.cat(raw, dim=1)


def predict(state: dict, data, rows: np.ndarray, env: TrainEnv, chunk: int = 2048) -> MethodOutput:
    """Eval-mode wagers (no dropout) -> weights, pooled prediction, payouts/advantages for `rows`.

    Wagers are float64 from the raw score on, through pooling, advantages and the returned arrays.
    """
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
    r = _raw_scores(state, heads, data, rows, dev, chunk)  # [D*M, n]
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
