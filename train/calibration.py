"""Adaptive temperature scaling of each agent's option distribution (SPEC §9, paper §4.5).

    cal = fit_calibration(data, CalibrationConfig(), env)  # train + val (SPEC §9); frozen afterwards
    probs = apply_calibration(cal, data, rows, env)        # [n, M, K] calibrated agent probs

Per agent (and, for private-context scenarios, per context ROLE: one head for rows where the agent
held the relevant context, one for all others) a small MLP on the agent's own hidden state predicts
a temperature T(x) = min(softplus(out) + t_min, t_max); the calibrated distribution is
softmax(log p / T). Initial T = t0 = 1 (zero-initialized last layer), so an untrained head is the
identity. Each head is fitted on its rows of the training view (train + val, as the reference's
train_val partition, SPEC §9) minus a seeded 10% holdout, with AdamW and
cross-entropy against the target (soft targets for BayesX-like data, one-hot otherwise; the
reference uses hard labels), early-stopped on the holdout NLL, best state restored.

All heads train together as one batched module (stacked weights, per-head masked AdamW: a head
whose epoch has run out of batches, or that has early-stopped, does not move at all), which gives
each head exactly the updates it would get if trained alone. Calibration does not depend on the
run's seed (the reference fits it once per pipeline too), so WALLA's fit computes it once for all
seeds. Lightning Fabric (walla.train.engine.make_fabric) places the heads and data on env.device and
runs forward/backward under env.precision; the masked per-head AdamW step is a custom in-place op.
The state is a plain dict (torch.save-able): cfg, agent, role, fitted, params, in_dims, holdout_nll.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from walla.manifests.validate import check, config, to_dict
from walla.store.schema import VARIANT_CODE
from walla.train.engine import TrainEnv, make_fabric, seeded
from walla.train.heads import stack_hidden


@config
class CalibrationConfig:
    """Adaptive temperature heads (SPEC §9); defaults are the reference's."""

    hidden: tuple[int, ...] = (256, 64)
    t0: float = 1.0  # initial temperature (last layer zero-init, bias = softplus^-1(t0 - t_min))
    t_min: float = 0.05  # T = softplus(out) + t_min, clamped at t_max
    t_max: float = 10.0
    lr: float = 1e-4  # AdamW
    weight_decay: float = 1e-5
    batch_size: int = 64
    epochs: int = 25
    clip: float = 1.0
    holdout: float = 0.1  # share of each head's rows held out for early stopping
    patience: int = 5  # epochs without held-out NLL improvement (> min_delta)
    min_delta: float = 1e-8
    seed: int = 18  # head g: holdout, init and order seeded by seed + g (seed-independent)
    by_role: str = "auto"  # auto: one head per context role when the scenario routes context
    agents: tuple[int, ...] | None = None  # slots to calibrate; None = all (reference: Gemma only = (0,))
    min_rows: int = 20  # a role with fewer rows keeps T = t0 (identity at t0 = 1)

    def __post_init__(self) -> None:
        ts = (self.t_min, self.t0, self.t_max)
        check(
            0 < self.t_min < self.t0 < self.t_max,
            "calibration t_min < t0 < t_max",
            "0 < t_min < t0 < t_max",
            ts,
        )
        check(self.lr > 0, "calibration lr", "> 0", self.lr)
        check(self.batch_size >= 1, "calibration batch_size", ">= 1", self.batch_size)
        check(self.epochs >= 1, "calibration epochs", ">= 1", self.epochs)
        check(0 < self.holdout < 1, "calibration holdout", "in (0, 1)", self.holdout)
        check(self.patience >= 1, "calibration patience", ">= 1", self.patience)
        check(self.by_role in ("auto", "yes", "no"), "calibration by_role", "auto | yes | no", self.by_role)


class _TempHeads(nn.Module):
    """G temperature MLPs as stacked parameters (head g = slice g): x [G, B, Hmax] -> T [G, B]."""

    def __init__(self, in_dims: list[int], cfg: CalibrationConfig) -> None:
        super().__init__()
        self.cfg = cfg
        dims = [max(in_dims), *cfg.hidden, 1]
        g = len(in_dims)
        pairs = list(zip(dims[:-1], dims[1:], strict=True))
        # initialized on the host (seeded CPU RNG: the same init on every device), moved by Fabric
        self.weights = nn.ParameterList(nn.Parameter(torch.zeros(g, a, b, device="cpu")) for a, b in pairs)
        self.biases = nn.ParameterList(nn.Parameter(torch.zeros(g, b, device="cpu")) for _, b in pairs)
        bias0 = math.log(math.expm1(cfg.t0 - cfg.t_min))  # softplus^-1(t0 - t_min): T starts at t0
        with torch.no_grad():
            for i, d in enumerate(in_dims):
                with seeded(cfg.seed + i):  # nn.Linear default init, fan_in = the agent's real H
                    pairs = zip([d, *cfg.hidden], cfg.hidden, strict=False)
                    layers = [nn.Linear(a, b, device="cpu") for a, b in pairs]
                for j, layer in enumerate(layers):
                    self.weights[j][i, : layer.in_features] = layer.weight.T
                    self.biases[j][i] = layer.bias
                self.biases[-1][i] = bias0  # last layer: zero weight, constant bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x  # [G, B, Hmax]
        last = len(self.weights) - 1
        for j, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            h = torch.baddbmm(b.unsqueeze(1), h, w)  # [G, B, d_j+1]
            if j < last:
                h = torch.relu(h)
        t = nn.functional.softplus(h.squeeze(-1)) + self.cfg.t_min  # [G, B]
        return t.clamp(max=self.cfg.t_max)


def _masked_adamw_(
    params, exp_avg, exp_sq, steps, on, lr, wd, clip, beta1=0.9, beta2=0.999, eps=1e-8
) -> None:
    """One AdamW step per head for heads with on[g] True; the others do not move at all (parameters and
    moments untouched). Same arithmetic as clip_grad_norm_ + torch.optim.AdamW on each head alone, done
    as in-place passes over the stacked tensors with per-head factors broadcast as [G, 1, ...]."""
    g_n = on.shape[0]
    norm = sum(torch.linalg.vector_norm(p.grad.reshape(g_n, -1), dim=1) ** 2 for p in params).sqrt()  # [G]
    onf = on.to(norm.dtype)
    scale = (clip / (norm + 1e-6)).clamp(max=1.0) * onf  # [G] clip_grad_norm_; 0 zeroes a resting head's grad
    steps += onf
    t = steps.clamp_min(1)
    step_size = onf * lr / (1 - beta1**t)  # [G]; 0 for resting heads
    bc2_sqrt = torch.sqrt(1 - beta2**t)  # [G]
    for p, m1, m2 in zip(params, exp_avg, exp_sq, strict=True):
        shape = (-1,) + (1,) * (p.dim() - 1)
        grad = p.grad.mul_(scale.view(shape))  # [G, ...] clipped; zero for resting heads
        p.mul_((1 - onf * lr * wd).view(shape))  # decoupled weight decay
        m1.mul_((1 - (1 - beta1) * onf).view(shape)).add_(grad, alpha=1 - beta1)
        m2.mul_((1 - (1 - beta2) * onf).view(shape)).addcmul_(grad, grad, value=1 - beta2)
        denom = m2.sqrt().div_(bc2_sqrt.view(shape)).add_(eps).div_(step_size.view(shape))  # inf if resting
        p.addcdiv_(m1, denom, value=-1.0)  # m1 / inf = 0: resting heads stay exactly where they are


def _log_probs(probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log p on enabled options, 0 on disabled ones (finite, so d(logp / T)/dT never sees -inf * 0;
    `_scaled` masks them out). probs [..., K], mask [..., K] bool."""
    return torch.where(mask, probs.clamp_min(1e-30).log(), torch.zeros_like(probs))


def _scaled(logp: torch.Tensor, temp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log softmax(logp / T) over enabled options. logp [..., K], temp [...]."""
    z = logp / temp.unsqueeze(-1)  # [..., K]
    return torch.log_softmax(z.masked_fill(~mask, -math.inf), dim=-1)


def _nll(logq: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Cross-entropy -sum_k y_k log q_k over enabled options -> [...]."""
    return -(torch.where(mask, target * logq, torch.zeros_like(logq))).sum(-1)


def _roles(data, by_role: str) -> np.ndarray | None:
    """[N, M] role per row and agent (0 = held the relevant context, 1 = other), or None (one head)."""
    routed = bool((data.variant == VARIANT_CODE["relevant"]).any())
    if by_role == "no" or (by_role == "auto" and not routed):
        return None
    return np.where(data.variant == VARIANT_CODE["relevant"], 0, 1)


def fit_calibration(data, cfg: CalibrationConfig, env: TrainEnv = TrainEnv()) -> dict:
    """Fit every agent's (per-role) temperature head on train + val; see module docstring.

    Raises:
        ValueError: `agents` naming a slot outside [0, M).
    """
    m = data.n_agents
    agents = list(range(m)) if cfg.agents is None else list(cfg.agents)
    bad = [a for a in agents if not 0 <= a < m]
    if bad:
        raise ValueError(
            f"calibration agents {bad} out of range: the scenario has {m} agent slots (0..{m - 1})"
        )
    train = np.sort(np.concatenate([data.split_index("train"), data.split_index("val")]))  # training view
    roles = _roles(data, cfg.by_role)
    head_agent, head_role, head_rows = [], [], []
    for a in agents:
        for r in [-1] if roles is None else [0, 1]:
            rows = train if r < 0 else train[roles[train, a] == r]
            head_agent.append(a)
            head_role.append(r)
            head_rows.append(rows)
    g_all = len(head_agent)
    in_dims = [int(data.hidden[a].shape[1]) for a in head_agent]
    fitted = [len(r) >= cfg.min_rows for r in head_rows]
    # seeded holdout split per head (reference: RandomState(18 + head index))
    fit_rows, hold_rows = [], []
    for g, rows in enumerate(head_rows):
        perm = np.random.RandomState(cfg.seed + g).permutation(len(rows))
        n_hold = max(1, int(round(cfg.holdout * len(rows)))) if len(rows) >= 2 else 0
        hold_rows.append(rows[perm[:n_hold]])
        fit_rows.append(rows[perm[n_hold:]])

    fabric = make_fabric(env)
    device = fabric.device
    heads = _TempHeads(in_dims, cfg)
    net = fabric.setup_module(heads)  # moves to env.device; forward under env.precision
    h_max = max(in_dims)
    bank = stack_hidden(data.hidden, train)[:, :, :h_max].to(device)  # [M, n_train, Hmax]; rows by position
    pos = np.full(len(data.split), -1, dtype=np.int64)
    pos[train] = np.arange(len(train))
    probs = torch.from_numpy(np.asarray(data.probs[train], dtype=np.float32)).to(device)  # [n_train, M, K]
    target = torch.from_numpy(np.asarray(data.target[train], dtype=np.float32)).to(device)  # [n_train, K]
    mask = torch.from_numpy(np.asarray(data.option_mask[train], dtype=bool)).to(device)  # [n_train, K]
    agent_t = torch.tensor(head_agent, device=device)[:, None]  # [G, 1]

    def padded(rows: list[np.ndarray], width: int | None = None) -> np.ndarray:
        """[G, width] train positions per head, -1 = padding."""
        width = width or max(1, max(len(r) for r in rows))
        out = np.full((g_all, width), -1, dtype=np.int64)
        for g, r in enumerate(rows):
            out[g, : len(r)] = pos[r[:width]]
        return out

    def batch_terms(idx_np: np.ndarray) -> tuple[torch.Tensor, ...]:
        idx = torch.from_numpy(idx_np).to(device)  # [G, b], -1 = padding
        valid = idx >= 0
        idx = idx.clamp_min(0)
        x = bank[agent_t, idx].float() * valid.unsqueeze(-1)  # [G, b, Hmax]
        logp = _log_probs(probs[idx, agent_t], mask[idx])  # [G, b, K]
        return x, logp, target[idx], mask[idx], valid

    def holdout_nll() -> torch.Tensor:
        with torch.no_grad():
            x, logp, y, msk, valid = batch_terms(hold_idx)
            nll = _nll(_scaled(logp, net(x).float(), msk), y, msk)  # [G, b]
            return (nll * valid).sum(1) / valid.sum(1).clamp_min(1)  # [G]

    hold_idx = padded(hold_rows)
    with torch.no_grad():
        x, logp, y, msk, valid = batch_terms(hold_idx)
        nll_t1 = _nll(torch.log_softmax(logp.masked_fill(~msk, -math.inf), -1), y, msk)
        nll_before = ((nll_t1 * valid).sum(1) / valid.sum(1).clamp_min(1)).tolist()

    # ---- batched training with per-head masked AdamW (slice g of every parameter = head g) ----------
    params = list(heads.parameters())
    exp_avg = [torch.zeros_like(p) for p in params]
    exp_sq = [torch.zeros_like(p) for p in params]
    steps = torch.zeros(g_all, device=device)  # per-head AdamW step count
    active = torch.tensor(fitted, device=device)
    best = [p.detach().clone() for p in params]
    best_nll = holdout_nll().clone()
    bad_epochs = torch.zeros(g_all, dtype=torch.long, device=device)
    for epoch in range(cfg.epochs):
        if not bool(active.any()):
            break
        orders = [
            r[np.random.RandomState((cfg.seed + g) * 1000 + epoch).permutation(len(r))]
            for g, r in enumerate(fit_rows)
        ]
        n_batches = np.array([math.ceil(len(r) / cfg.batch_size) for r in orders])
        order_idx = padded(orders, int(n_batches.max(initial=1)) * cfg.batch_size)  # [G, nb * bs]
        for t in range(int(n_batches.max(initial=0))):
            step_on = active & torch.from_numpy(t < n_batches).to(device)  # [G]
            if not bool(step_on.any()):
                break
            idx_np = order_idx[:, t * cfg.batch_size : (t + 1) * cfg.batch_size].copy()
            idx_np[~step_on.cpu().numpy()] = -1
            x, logp, y, msk, valid = batch_terms(idx_np)
            nll = _nll(_scaled(logp, net(x).float(), msk), y, msk)  # [G, b]
            loss = ((nll * valid).sum(1) / valid.sum(1).clamp_min(1)).sum()  # sum of per-head means
            for p in params:
                p.grad = None
            fabric.backward(loss)
            with torch.no_grad():
                _masked_adamw_(params, exp_avg, exp_sq, steps, step_on, cfg.lr, cfg.weight_decay, cfg.clip)
        # ---- per-head early stopping on the holdout NLL ------------------------------------------
        nll = holdout_nll()
        improved = active & (nll < best_nll - cfg.min_delta)
        with torch.no_grad():
            for p, bp in zip(params, best, strict=True):
                bp.copy_(torch.where(improved.view((-1,) + (1,) * (p.dim() - 1)), p, bp))
        best_nll = torch.where(improved, nll, best_nll)
        bad_epochs = torch.where(improved, torch.zeros_like(bad_epochs), bad_epochs + active.long())
        active = active & (bad_epochs < cfg.patience)

    with torch.no_grad():
        for p, bp in zip(params, best, strict=True):
            p.copy_(bp)
    after = holdout_nll().tolist()
    return {
        "cfg": to_dict(cfg),
        "agent": head_agent,  # [G] agent slot of each head
        "role": head_role,  # [G] 0 = held the relevant context, 1 = everything else, -1 = all rows
        "fitted": fitted,  # [G] False: too few rows, T = t0
        "params": [p.detach().cpu().clone() for p in params],  # stacked MLP parameters (head g = slice g)
        "in_dims": in_dims,  # [G] hidden size of each head's agent
        "holdout_nll": [list(pair) for pair in zip(nll_before, after, strict=True)],  # [G] (before, after)
    }


def temperatures(
    state: dict, data, rows: np.ndarray, env: TrainEnv = TrainEnv(), batch: int = 4096
) -> np.ndarray:
    """Per-agent temperature [n, M] for the given rows (1.0 for uncalibrated agents / unfitted roles)."""
    rows = np.asarray(rows, dtype=np.int64)
    m, dev, cfg = data.n_agents, torch.device(env.device), CalibrationConfig(**state["cfg"])
    temps = np.ones((len(rows), m), dtype=np.float32)
    heads = _TempHeads(state["in_dims"], cfg).to(dev)
    with torch.no_grad():
        for p, v in zip(heads.parameters(), state["params"], strict=True):
            p.copy_(v)
    roles = _roles(data, cfg.by_role) if any(r >= 0 for r in state["role"]) else None
    agent_t = torch.tensor(state["agent"], device=dev)[:, None]  # [G, 1]
    for start in range(0, len(rows), batch):
        chunk = rows[start : start + batch]
        bank = stack_hidden(data.hidden, chunk)[:, :, : max(state["in_dims"])].to(dev)  # [M, n, Hmax]
        x = bank[agent_t, torch.arange(len(chunk), device=dev)[None, :]].float()  # [G, n, Hmax]
        with torch.no_grad():
            t = heads(x).cpu().numpy()  # [G, n]
        for g, (a, r) in enumerate(zip(state["agent"], state["role"], strict=True)):
            if not state["fitted"][g]:
                t_g = np.full(len(chunk), cfg.t0, dtype=np.float32)
            else:
                t_g = t[g]
            sel = np.ones(len(chunk), dtype=bool) if r < 0 else roles[chunk, a] == r
            temps[start : start + len(chunk), a][sel] = t_g[sel]
    return temps


def apply_calibration(state: dict, data, rows: np.ndarray, env: TrainEnv = TrainEnv()) -> np.ndarray:
    """Calibrated agent probs [n, M, K] = softmax(log p / T(x)) for the given rows (float32)."""
    rows = np.asarray(rows, dtype=np.int64)
    temps = torch.from_numpy(temperatures(state, data, rows, env))  # [n, M]
    probs = torch.from_numpy(np.asarray(data.probs[rows], dtype=np.float32))  # [n, M, K]
    mask = torch.from_numpy(np.asarray(data.option_mask[rows], dtype=bool))[:, None, :].expand_as(probs)
    with torch.no_grad():
        out = _scaled(_log_probs(probs, mask), temps, mask).exp()  # [n, M, K]
    return out.numpy().astype(np.float32)
