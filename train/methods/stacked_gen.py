"""StackedGen baseline: one CENTRALIZED MLP on all agents' hidden states -> aggregation weights (SPEC §6).

    x = concat_i Linear_i(normalize?(h_i))      per-agent Linear(H_i -> 4096) projection (reference;
                                                projection_dim null: concat_i h_i directly)
    logits = MLP(x; 512, 256, ReLU, dropout 0.1) -> M;   weights = softmax(logits / 2)
    loss = -mean sum_k q_k log(p_agg,k + 1e-10),   p_agg = linear pool of the agents' probs with weights

Adam, batch 100, 50 epochs, grad clip 1.0 separately for the MLP and the projections (as the reference),
validation early stopping (SPEC §4.3). All seeds train as ONE module (`SeedStackedGen`, stacked
parameters [S, ...], batched matmuls): each seed keeps its own init (nn.Linear defaults drawn on the
training device from a generator seeded with the seed, engine.init_generator: on the CPU the values of
nn.Linear under seeded(seed)), batch order (row_batches with its seed), dropout masks (its own generator),
clipping and early stopping (clipping.clip_gradients, scope "slice": each seed's slice of each group alone),
and Adam is elementwise, so each seed's trajectory is that of training it alone. The loop is
fit_loop.fit_module; best states and the states handed back stay on the training device.
The SPEC learning rates (1e-7 MMLU/MedMCQA, 5e-7 PubMedQA hetero, 5e-6 homogeneous/BayesX) are set by
the scenario manifests; the module default is the largest one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from walla.manifests.validate import build, check, config, to_dict
from walla.train.engine import (
    TrainEnv,
    fit_module,
    init_device,
    init_generator,
    linear_init_,
    row_batches,
    to_device,
    to_host,
)
from walla.train.method_io import as_rows, pooled_output, scenario_tensors
from walla.train.methods import LogFn, MethodOutput
from walla.train.pooling_losses import mixture_nll, val_metric

MATERIALIZE_BYTES = 2 << 30  # below this the fit's hidden rows are gathered once (float32), else per batch
CHUNK = 4096  # rows per forward pass at validation/predict


@config
class Config:
    lr: float = 5e-6  # Adam
    epochs: int = 50
    batch_size: int = 100
    hidden: tuple[int, ...] = (512, 256)
    dropout: float = 0.1
    temperature: float = 2.0  # weights = softmax(logits / temperature)
    projection_dim: int | None = 4096  # per-agent Linear(H_i -> P) before the MLP; null: none
    normalize_hidden: bool = False  # L2-normalize each agent's hidden state (reference: PubMedQA hetero)
    clip: float = 1.0  # per seed, MLP and projections clipped separately
    patience: int = 5  # validation epochs without improvement (wrong-context: 50)
    reference_early_stopping: bool = False  # SPEC §10.2: all epochs, keep the last (soft targets: best KL)

    def __post_init__(self) -> None:
        for key in ("lr", "clip", "temperature"):
            check(getattr(self, key) > 0, key, "> 0", getattr(self, key))
        for key in ("epochs", "batch_size", "patience"):
            check(getattr(self, key) >= 1, key, ">= 1", getattr(self, key))
        check(0.0 <= self.dropout < 1.0, "dropout", "in [0, 1)", self.dropout)
        check(bool(self.hidden) and min(self.hidden) >= 1, "hidden", "sizes >= 1, at least one", self.hidden)
        check((self.projection_dim or 1) >= 1, "projection_dim", ">= 1 or null", self.projection_dim)


def layer_shapes(sizes: Sequence[int], c: Config) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(in, out) of one seed's reference network: the MLP's layers, then the per-agent projections."""
    p = c.projection_dim
    width = p * len(sizes) if p is not None else sum(sizes)
    dims = [width, *c.hidden, len(sizes)]
    proj = [(h, p) for h in sizes] if p is not None else []
    return list(zip(dims[:-1], dims[1:], strict=True)), proj


class StackedNet(nn.Module):
    """One seed's reference network (plain nn.Linear layers): what SeedStackedGen's slice s computes."""

    def __init__(self, sizes: Sequence[int], c: Config):
        super().__init__()
        mlp, proj = layer_shapes(sizes, c)
        self.mlp = nn.ModuleList(nn.Linear(a, b) for a, b in mlp)
        # created after the MLP, as the reference adds its projections lazily on the first batch
        self.proj = nn.ModuleList(nn.Linear(a, b) for a, b in proj) if proj else None


class SeedStackedGen(nn.Module):
    """S StackedGen networks (one per seed) as stacked parameters; seed s only touches slice s.

    proj_w[i] [S, H_i, P], proj_b[i] [S, P] (per-agent projections); mlp_w[j] [S, a, b], mlp_b[j] [S, b].
    """

    def __init__(self, sizes: Sequence[int], n_seeds: int, c: Config, device: str | torch.device = "cpu"):
        super().__init__()
        self.sizes, self.normalize, self.dropout = [int(h) for h in sizes], c.normalize_hidden, c.dropout
        mlp, proj = layer_shapes(self.sizes, c)

        def stacked(shapes) -> tuple[nn.ParameterList, nn.ParameterList]:
            ws = nn.ParameterList(nn.Parameter(torch.zeros(n_seeds, a, b, device=device)) for a, b in shapes)
            bs = nn.ParameterList(nn.Parameter(torch.zeros(n_seeds, b, device=device)) for _, b in shapes)
            return ws, bs

        self.mlp_w, self.mlp_b = stacked(mlp)
        self.proj_w, self.proj_b = stacked(proj) if proj else (None, None)

    @property
    def widths(self) -> list[int]:
        """Widths of the dropout layers (every MLP layer but the last)."""
        return [int(b.shape[1]) for b in self.mlp_b][:-1]

    def groups(self) -> list[list[nn.Parameter]]:
        """Parameter groups clipped separately: the MLP, then the projections."""
        out = [[*self.mlp_w, *self.mlp_b]]
        if self.proj_w is not None:
            out.append([*self.proj_w, *self.proj_b])
        return out

    @torch.no_grad()
    def init_seed_(self, s: int, generator: torch.Generator) -> None:
        """Seed s's nn.Linear default init drawn in place from `generator`: the MLP's layers, then the
        projections (the reference creates them lazily, after the MLP), each weight then bias."""
        ws = [*self.mlp_w, *(self.proj_w or [])]
        bs = [*self.mlp_b, *(self.proj_b or [])]
        for w, b in zip(ws, bs, strict=True):
            linear_init_(w[s], b[s], generator)

    def forward(
        self, xs: Sequence[torch.Tensor], masks: Sequence[torch.Tensor] | None = None
    ) -> torch.Tensor:
        """xs: per agent [S, B, H_i] -> logits [S, B, M].

        masks: keep-masks [S, B, w] per dropout layer (None: eval, no dropout).
        """
        parts = []
        for i, x in enumerate(xs):
            if self.normalize:
                x = nn.functional.normalize(x, dim=-1, eps=1e-8)
            if self.proj_w is not None:
                x = torch.baddbmm(self.proj_b[i].unsqueeze(1), x, self.proj_w[i])  # [S, B, P]
            parts.append(x)
        h = torch.cat(parts, dim=-1)  # [S, B, M*P] or [S, B, sum H_i]
        last = len(self.mlp_w) - 1
        for j, (w, b) in enumerate(zip(self.mlp_w, self.mlp_b, strict=True)):
            h = torch.baddbmm(b.unsqueeze(1), h, w)  # [S, B, d_j+1]
            if j < last:
                h = torch.relu(h)
                if masks is not None:
                    h = h * masks[j] * (1.0 / (1.0 - self.dropout))
        return h  # [S, B, M] logits


class HiddenRows:
    """Agents' hidden states by row on a device: rows [..., B] -> per agent float32 [..., B, H_i].

    The rows a fit touches are converted once when they fit in MATERIALIZE_BYTES, else per batch
    (hidden arrays may be float16 memory maps of a large store).
    """

    def __init__(self, hidden: list[np.ndarray], device: str, keep_rows: np.ndarray | None = None):
        self.hidden, self.device = hidden, device
        self.pos: torch.Tensor | None = None
        sizes = sum(int(h.shape[1]) for h in hidden)
        if keep_rows is not None and len(keep_rows) * sizes * 4 <= MATERIALIZE_BYTES:
            self.mat = [self._gather(h, keep_rows) for h in hidden]  # per agent [n_keep, H_i]
            pos = np.full(hidden[0].shape[0], -1, dtype=np.int64)
            pos[keep_rows] = np.arange(len(keep_rows))
            self.pos = torch.from_numpy(pos)

    def _gather(self, h: np.ndarray, rows: np.ndarray) -> torch.Tensor:
        flat = rows.reshape(-1)
        order = np.argsort(flat, kind="stable")  # memory maps read fastest in order
        out = np.empty((len(flat), h.shape[1]), dtype=np.float32)
        out[order] = np.asarray(h[flat[order]], dtype=np.float32)
        return torch.from_numpy(out).to(self.device).reshape(*rows.shape, h.shape[1])

    def __call__(self, rows: np.ndarray) -> list[torch.Tensor]:
        if self.pos is not None:
            local = self.pos[torch.from_numpy(rows)]  # host lookup: no device synchronization
            if bool((local >= 0).all()):
                local = to_device(local, self.device)
                return [m[local] for m in self.mat]
        return [self._gather(h, rows) for h in self.hidden]


def _check_hidden(data) -> list[int]:
    if len(data.hidden) != data.n_agents:
        raise ValueError(
            f"scenario {data.name!r}: {len(data.hidden)} hidden arrays for {data.n_agents} agents"
        )
    for i, h in enumerate(data.hidden):
        if h.ndim != 2 or h.shape[0] != len(data.split):
            raise ValueError(
                f"scenario {data.name!r}: hidden[{i}] has shape {h.shape}, expected [{len(data.split)}, H]"
            )
    return [int(h.shape[1]) for h in data.hidden]


def _weights(net: SeedStackedGen, xs: list[torch.Tensor], temperature: float) -> torch.Tensor:
    return torch.softmax(net(xs) / temperature, dim=-1)  # [S, n, M]


def _eval_weights(net: SeedStackedGen, x: HiddenRows, rows: np.ndarray, n_seeds: int, c: Config):
    """Eval-mode weights of every seed on the same rows: [S, n, M]."""
    out = []
    for s in range(0, len(rows), CHUNK):
        xs = [v.unsqueeze(0).expand(n_seeds, -1, -1) for v in x(rows[s : s + CHUNK])]  # [S, b, H_i]
        out.append(_weights(net, xs, c.temperature))
    return torch.cat(out, dim=1)


class _SeedStopping:
    """Per-seed validation early stopping at each epoch end (SPEC §4.3), run from the engine's on_step.

    Best states are in-memory copies of the seed's slices: validation runs once per epoch, so a copy
    per improvement is cheap next to the epoch it follows, and no disk round trip is needed.
    """

    def __init__(self, net: SeedStackedGen, val_fn, n_seeds: int, patience: int):
        self.net, self.val_fn, self.patience = net, val_fn, patience
        self.best = [None] * n_seeds
        self.best_val = [float("inf")] * n_seeds
        self.best_epoch: list[int | None] = [None] * n_seeds
        self.bad = [0] * n_seeds
        self.stop_epoch: list[int | None] = [None] * n_seeds

    @torch.no_grad()
    def epoch_end(self, epoch: int) -> bool:
        vals = self.val_fn().tolist()  # [S]
        for s, v in enumerate(vals):
            if self.stop_epoch[s] is not None:
                continue
            if v < self.best_val[s]:
                self.best_val[s], self.best_epoch[s], self.bad[s] = v, epoch, 0
                self.best[s] = [p.detach()[s].clone() for p in self.net.parameters()]
            else:
                self.bad[s] += 1
                if self.bad[s] >= self.patience:
                    self.stop_epoch[s] = epoch
        return all(e is not None for e in self.stop_epoch)

    @torch.no_grad()
    def restore(self) -> None:
        for s, best in enumerate(self.best):
            if best is not None:
                for p, v in zip(self.net.parameters(), best, strict=True):
                    p[s] = v


def init_net(
    sizes: list[int], seeds: list[int], c: Config, device: str | torch.device = "cpu"
) -> SeedStackedGen:
    """Every seed's default init drawn on `device` from a generator seeded with the seed, in one module.

    On the CPU slice s equals `with seeded(seed): StackedNet(sizes, c)` (engine.init_generator).
    """
    net = SeedStackedGen(sizes, len(seeds), c, device)
    for s, seed in enumerate(seeds):
        net.init_seed_(s, init_generator(seed, device))
    return net


class _SeedLoss:
    """The batched loss: each seed's mixture NLL on its own batch with its own dropout masks.

    Called by fit_module as loss_fn(module, rows [S, b]); the per-seed losses of the last batch are
    kept for the per-seed logs.
    """

    def __init__(self, net: SeedStackedGen, x: HiddenRows, probs, target, seeds: list[int], c: Config):
        self.net, self.x, self.probs, self.target, self.c = net, x, probs, target, c
        self.gens = [np.random.default_rng(seed) for seed in seeds]  # per-seed dropout streams
        self.last: torch.Tensor | None = None  # [S]

    def _masks(self, b: int) -> list[torch.Tensor]:
        """Keep-masks [S, b, w] per dropout layer, each seed's from its own generator."""
        keep = 1.0 - self.c.dropout
        out = []
        for w in self.net.widths:
            draws = np.stack([g.random((b, w), dtype=np.float32) < keep for g in self.gens])  # [S, b, w]
            out.append(to_device(draws, self.x.device).to(torch.float32))
        return out

    def __call__(self, module: nn.Module, rows: np.ndarray):
        masks = self._masks(rows.shape[1])
        idx = to_device(rows, self.x.device)  # [S, b]
        w = torch.softmax(module(self.x(rows), masks) / self.c.temperature, dim=-1)  # [S, b, M]
        per_seed = mixture_nll(w, self.probs[idx], self.target[idx]).mean(-1)  # [S]
        self.last = per_seed.detach()
        return per_seed.sum(), {"batch_size": rows.shape[1]}  # seed s's gradient = its own loss's


def _log_seeds(
    logs: Sequence[LogFn | None], step: int, row: dict, losses: torch.Tensor, grad_norms: torch.Tensor
) -> None:
    """One log row per seed: its own loss and pre-clip gradient norm.

    losses [S]; grad_norms [n_groups, S]: a seed's norm is the larger of the MLP's and the projections'.
    """
    if all(log is None for log in logs):
        return
    back = to_host({"loss": losses, "norm": grad_norms.max(0).values})  # one transfer
    losses, norms = back["loss"].tolist(), back["norm"].tolist()
    for s, log in enumerate(logs):
        if log is not None:
            entry = {"step": step, "epoch": row["epoch"], "n_seen": row["n_seen"]}
            log({**entry, "loss": losses[s], "grad_norm": norms[s]})


def _seed_state(net: SeedStackedGen, s: int, c: Config, sizes: list[int], stopping, epochs_run: int) -> dict:
    names = [name for name, _ in net.named_parameters()]
    stop_epoch = stopping.stop_epoch[s]
    return {
        "config": to_dict(c),
        "sizes": sizes,
        "params": {n: p.detach()[s].clone() for n, p in zip(names, net.parameters(), strict=True)},
        "best_epoch": stopping.best_epoch[s],
        "epochs_run": stop_epoch + 1 if stop_epoch is not None else epochs_run,
    }


def fit(data, cfg: Config, seeds: Sequence[int], env: TrainEnv, logs: Sequence[LogFn | None]) -> list[dict]:
    """Train every seed's network as one batched module; one state per seed."""
    c, seeds = cfg, list(seeds)
    sizes, n_s = _check_hidden(data), len(seeds)
    train_rows, val_rows = data.split_index("train"), data.split_index("val")
    if len(train_rows) == 0:
        raise ValueError(f"scenario {data.name!r} has no train rows to fit on")
    probs, target, _ = scenario_tensors(data, env.device)
    x = HiddenRows(data.hidden, env.device, np.concatenate([train_rows, val_rows]))
    net = init_net(sizes, seeds, c, init_device(env.device))
    orders = [row_batches(train_rows, c.batch_size, seed) for seed in seeds]
    batches = [np.stack(b) for b in zip(*orders, strict=True)]  # per step [S, b]: each seed its own order
    loss = _SeedLoss(net, x, probs, target, seeds, c)
    use_val = len(val_rows) > 0 and (bool(data.soft_target) or not c.reference_early_stopping)
    soft = bool(data.soft_target)
    val_idx = to_device(val_rows, env.device)
    vp, vt = probs[val_idx], target[val_idx]
    stopping = _SeedStopping(
        net, lambda: val_metric(_eval_weights(net, x, val_rows, n_s, c), vp, vt, soft), n_s, c.patience
    )

    def on_step(step: int, row: dict, grad_norms: torch.Tensor) -> bool:
        _log_seeds(logs, step, row, loss.last, grad_norms)
        return use_val and step % len(batches) == 0 and stopping.epoch_end(step // len(batches) - 1)

    res = fit_module(
        net,
        loss,
        batches,
        env=env,
        optimizer="adam",
        lr=c.lr,
        param_groups=[{"params": g} for g in net.groups()],
        epochs=c.epochs,
        clip=c.clip,
        clip_scope="slice",
        on_step=on_step,
        seed=seeds[0],
    )
    stopping.restore()
    return [_seed_state(net, s, c, sizes, stopping, res.epochs_run) for s in range(n_s)]


def predict(state: dict, data, rows: np.ndarray, env: TrainEnv) -> MethodOutput:
    c = build(Config, state["config"], "stacked-gen state")
    rows = as_rows(rows, len(data.split))
    sizes = _check_hidden(data)
    if sizes != state["sizes"]:
        raise ValueError(
            f"scenario {data.name!r}: hidden sizes {sizes} differ from the fitted {state['sizes']}"
        )
    net = SeedStackedGen(sizes, 1, c, env.device)
    net.load_state_dict({k: v.unsqueeze(0) for k, v in state["params"].items()})
    with torch.no_grad():
        weights = _eval_weights(net, HiddenRows(data.hidden, env.device), rows, 1, c)[0]  # [n, M]
    return pooled_output(data, rows, weights)
