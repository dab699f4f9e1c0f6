"""StackedGen baseline: one CENTRALIZED MLP on all agents' hidden states -> aggregation weights (SPEC §6).

    x = concat_i [normalize?(h_i)]            (or concat_i Linear(H_i -> projection_dim)(h_i), reference)
    logits = MLP(x; 512, 256, ReLU, dropout 0.1) -> M;   weights = softmax(logits / 2)
    loss = -mean sum_k q_k log(p_agg,k + 1e-10),   p_agg = linear pool of the agents' probs with weights

Unlike WALLA it sees every agent's hidden state at once. Adam, grad clip 1.0 per parameter group (MLP and
projections separately, as the reference), batch 100, 50 epochs, validation early stopping (_baselines).
Default: no per-agent 4096 projection (a linear map followed by a linear layer adds no expressiveness,
SPEC §5.1 note); ``projection_dim: 4096`` reproduces the reference head.
The SPEC learning rates (1e-7 MMLU/MedMCQA, 5e-7 PubMedQA hetero, 5e-6 homogeneous/BayesX) are tuned to
7B-model hidden states; scenario manifests set them, the module default is the largest one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from walla.train.lit import seeded
from walla.train.methods import LogFn, MethodOutput
from walla.train.methods._baselines import (
    as_rows,
    build_config,
    check_common,
    fit_weight_model,
    mixture_ce,
    pooled_output,
    resolved_dict,
    scenario_tensors,
)

NAME = "stacked-gen"
MATERIALIZE_BYTES = 2 << 30  # below this the fit's hidden rows are gathered once as float32, else per batch


@dataclass(frozen=True)
class StackedGenConfig:
    lr: float = 5e-6
    epochs: int = 50
    batch_size: int = 100
    hidden: tuple[int, ...] = (512, 256)
    dropout: float = 0.1
    temperature: float = 2.0  # weights = softmax(logits / temperature)
    projection_dim: int | None = None  # reference: 4096 (per-agent Linear before the MLP)
    normalize_hidden: bool = False  # L2-normalize each agent's hidden state (reference: PubMedQA hetero)
    clip: float = 1.0
    weight_decay: float = 0.0
    patience: int = 5  # validation epochs without improvement (wrong-context: 50)
    reference_early_stopping: bool = (
        False  # SPEC §10.2: train all epochs, keep the last (soft targets: best KL)
    )
    engine: str = "lightning"  # lit.fit_module engine: lightning | loop (same steps)

    def check(self, method: str) -> None:
        check_common(self, method)
        if not self.hidden or min(self.hidden) < 1:
            raise ValueError(f"{method}: config key 'hidden' must be a non-empty list of sizes >= 1")
        if self.projection_dim is not None and self.projection_dim < 1:
            raise ValueError(f"{method}: config key 'projection_dim' must be >= 1 or null")


class StackedNet(nn.Module):
    """Concatenated hidden states [B, sum H_i] -> weight logits [B, M]."""

    def __init__(self, sizes: list[int], c: StackedGenConfig):
        super().__init__()
        self.sizes, self.normalize = list(sizes), c.normalize_hidden
        self.proj = (
            nn.ModuleList(nn.Linear(h, c.projection_dim) for h in sizes)
            if c.projection_dim is not None
            else None
        )
        width = c.projection_dim * len(sizes) if c.projection_dim is not None else sum(sizes)
        layers: list[nn.Module] = []
        for h in c.hidden:
            layers += [nn.Linear(width, h), nn.ReLU(), nn.Dropout(c.dropout)]
            width = h
        layers.append(nn.Linear(width, len(sizes)))
        self.mlp = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.normalize or self.proj is not None:
            parts = list(torch.split(x, self.sizes, dim=-1))  # M x [B, H_i]
            if self.normalize:
                parts = [nn.functional.normalize(p, dim=-1, eps=1e-8) for p in parts]
            if self.proj is not None:
                parts = [lin(p) for lin, p in zip(self.proj, parts, strict=True)]  # M x [B, P]
            x = torch.cat(parts, dim=-1)  # [B, M*P] or [B, sum H_i]
        return self.mlp(x)  # [B, M]


class HiddenRows:
    """Row gatherer over the agents' hidden arrays: rows -> float32 [n, sum H_i].

    The rows a fit touches are converted once when they fit in MATERIALIZE_BYTES, else per batch
    (hidden arrays may be float16 memory maps of a large store).
    """

    def __init__(self, hidden: list[np.ndarray], keep_rows: np.ndarray | None = None):
        self.hidden = hidden
        self.sizes = [int(h.shape[1]) for h in hidden]
        self.pos: np.ndarray | None = None
        self.mat: torch.Tensor | None = None
        if keep_rows is not None and len(keep_rows) * sum(self.sizes) * 4 <= MATERIALIZE_BYTES:
            self.mat = self._gather(keep_rows)  # [n_keep, sum H]
            self.pos = np.full(hidden[0].shape[0], -1, dtype=np.int64)
            self.pos[keep_rows] = np.arange(len(keep_rows))

    def _gather(self, rows: np.ndarray) -> torch.Tensor:
        sorted_rows = np.sort(rows)  # memory maps read fastest in order
        back = np.argsort(np.argsort(rows, kind="stable"), kind="stable")
        parts = [np.asarray(h[sorted_rows], dtype=np.float32)[back] for h in self.hidden]
        return torch.from_numpy(np.concatenate(parts, axis=1))  # [n, sum H]

    def __call__(self, rows: np.ndarray) -> torch.Tensor:
        if self.mat is not None:
            local = self.pos[rows]
            if (local >= 0).all():
                return self.mat[torch.from_numpy(local)]
        return self._gather(rows)


def _check_hidden(data) -> None:
    if len(data.hidden) != data.n_agents:
        raise ValueError(
            f"scenario {data.name!r}: {len(data.hidden)} hidden arrays for {data.n_agents} agents"
        )
    for i, h in enumerate(data.hidden):
        if h.ndim != 2 or h.shape[0] != len(data.split):
            raise ValueError(
                f"scenario {data.name!r}: hidden[{i}] has shape {h.shape}, expected [{len(data.split)}, H]"
            )


def resolve(data, cfg: dict | None) -> dict:
    """The fully resolved config (defaults filled in) that run.json records."""
    return resolved_dict(StackedGenConfig, cfg, NAME)


def fit(data, cfg: dict, seed: int, log: LogFn | None = None) -> dict:
    """Train the centralized MLP on the train split (early stopping on val); returns its state."""
    c = build_config(StackedGenConfig, cfg, NAME)
    _check_hidden(data)
    probs, target, _ = scenario_tensors(data)
    fit_rows = np.concatenate([data.split_index("train"), data.split_index("val")])
    x = HiddenRows(data.hidden, fit_rows)
    with seeded(seed):
        net = StackedNet(x.sizes, c)

    def weights_fn(module: nn.Module, rows: np.ndarray) -> torch.Tensor:
        return torch.softmax(module(x(rows)) / c.temperature, dim=-1)  # [B, M]

    def loss_fn(module: nn.Module, rows: np.ndarray):
        return mixture_ce(weights_fn(module, rows), probs[rows], target[rows])

    groups = [{"params": list(net.mlp.parameters())}]
    if net.proj is not None:
        groups.append({"params": list(net.proj.parameters())})  # clipped separately (reference)
    res = fit_weight_model(
        net, data, loss_fn, weights_fn, c, seed, log, param_groups=groups, optimizer="adam"
    )
    return {
        "config": c,
        "net": res.module,
        "sizes": x.sizes,
        "best_epoch": res.best_epoch,
        "epochs_run": res.epochs_run,
    }


def predict(state: dict, data, rows: np.ndarray) -> MethodOutput:
    c, net = state["config"], state["net"]
    rows = as_rows(rows, len(data.split))
    _check_hidden(data)
    sizes = [int(h.shape[1]) for h in data.hidden]
    if sizes != state["sizes"]:
        raise ValueError(
            f"scenario {data.name!r}: hidden sizes {sizes} differ from the fitted {state['sizes']}"
        )
    x = HiddenRows(data.hidden)
    net.eval()
    out = []
    with torch.no_grad():
        for s in range(0, len(rows), 4096):
            out.append(torch.softmax(net(x(rows[s : s + 4096])) / c.temperature, dim=-1))  # [b, M]
    weights = torch.cat(out) if out else torch.zeros((0, data.n_agents))
    return pooled_output(data, rows, weights)
