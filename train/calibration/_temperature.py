"""Adaptive temperature scaling of each agent's option distribution (SPEC §9, paper §4.5).

    cal = fit_calibration(data, CalibrationConfig(), env)  # train + val (SPEC §9); frozen afterwards
    probs = apply_calibration(cal, data, rows, env)        # [n, M, K] calibrated agent probs

Per agent (and, for private-context scenarios, per context ROLE: one head for rows where the agent held
the relevant context, one for all others) a small MLP on the agent's own hidden state predicts a
temperature T(x) = min(softplus(out) + t_min, t_max); the calibrated distribution is softmax(log p / T)
(calibration/heads.py). Initial T = t0 = 1 (zero-initialized last layer), so an untrained head is the
identity. Each head is fitted on its rows of the training view (train + val, as the reference's train_val
partition, SPEC §9) minus a seeded 10% holdout, with AdamW and cross-entropy against the target (soft
targets for BayesX-like data, one-hot otherwise; the reference uses hard labels), early-stopped on the
holdout NLL, best state restored.

All heads train together: one forward over their stacked weights (torch.baddbmm), one AdamW (the
engine's, one param group per head) and clipping per head (clipping.clip_gradients, scope "group").
Each head keeps its own parameter tensors, so a head whose epoch has run out of batches, or that has
early-stopped, has its gradients dropped and torch's AdamW leaves it alone (no step, no decay, its
step count unchanged): each head gets exactly the updates it would get if trained alone. Calibration
does not depend on the run's seed (the reference fits it once per pipeline too), so WALLA's fit
computes it once for all seeds. Lightning Fabric (engine.make_fabric) places the heads and data on
env.device and runs forward/backward under env.precision; the heads are initialised there (engine.
init_generator: on the CPU the values of nn.Linear under seeded(seed)), their best states stay there, and
`temperatures` / `apply_calibration` compute on env.device too, returning host arrays.
The state is a plain dict (torch.save-able): cfg, agent, role, fitted, params (stacked [G, ...], weights
then biases), in_dims, holdout_nll.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from walla.manifests.validate import check, config, to_dict
from walla.store.schema import VARIANT_CODE
from walla.train.calibration._heads import TempHeads, log_probs, nll, scaled
from walla.train.engine import TrainEnv, clip_gradients, init_device, make_fabric, make_optimizer, to_device
from walla.train.wagers import stack_hidden


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


def _heads(in_dims: list[int], cfg: CalibrationConfig, device, init: bool = True) -> TempHeads:
    """The temperature heads of `cfg` for agents of hidden sizes `in_dims` (head g seeded cfg.seed + g)."""
    return TempHeads(in_dims, cfg.hidden, cfg.t0, cfg.t_min, cfg.t_max, cfg.seed, device, init)


def _roles(data, by_role: str) -> np.ndarray | None:
    """[N, M] role per row and agent (0 = held the relevant context, 1 = other), or None (one head)."""
    routed = bool((data.variant == VARIANT_CODE["relevant"]).any())
    if by_role == "no" or (by_role == "auto" and not routed):
        return None
    return np.where(data.variant == VARIANT_CODE["relevant"], 0, 1)


@dataclass
class _HeadRows:
    """Which rows each head fits on: head g calibrates agent[g] on rows of role[g]."""

    agent: list[int]  # [G] agent slot
    role: list[int]  # [G] 0 = held the relevant context, 1 = everything else, -1 = all rows
    fitted: list[bool]  # [G] False: fewer than min_rows rows, T stays t0
    fit_rows: list[np.ndarray]  # [G] training rows
    hold_rows: list[np.ndarray]  # [G] seeded holdout rows (early stopping)


def _head_rows(data, cfg: CalibrationConfig, train: np.ndarray) -> _HeadRows:
    """One head per calibrated agent (and context role), its rows split into fit and holdout."""
    m = data.n_agents
    agents = list(range(m)) if cfg.agents is None else list(cfg.agents)
    bad = [a for a in agents if not 0 <= a < m]
    if bad:
        raise ValueError(
            f"calibration agents {bad} out of range: the scenario has {m} agent slots (0..{m - 1})"
        )
    roles = _roles(data, cfg.by_role)
    head_agent, head_role, head_rows = [], [], []
    for a in agents:
        for r in [-1] if roles is None else [0, 1]:
            head_agent.append(a)
            head_role.append(r)
            head_rows.append(train if r < 0 else train[roles[train, a] == r])
    fit_rows, hold_rows = [], []
    for g, rows in enumerate(head_rows):  # seeded holdout split per head (reference: RandomState(18 + g))
        perm = np.random.RandomState(cfg.seed + g).permutation(len(rows))
        n_hold = max(1, int(round(cfg.holdout * len(rows)))) if len(rows) >= 2 else 0
        hold_rows.append(rows[perm[:n_hold]])
        fit_rows.append(rows[perm[n_hold:]])
    fitted = [len(r) >= cfg.min_rows for r in head_rows]
    return _HeadRows(head_agent, head_role, fitted, fit_rows, hold_rows)


class _HeadBatches:
    """The training view's tensors on the device, gathered per head: batches are [G, b] positions."""

    def __init__(self, data, train: np.ndarray, agent: list[int], h_max: int, device) -> None:
        self.device, self.n_heads = device, len(agent)
        self.bank = stack_hidden(data.hidden, train)[:, :, :h_max].to(device)  # [M, n_train, Hmax]
        self.pos = np.full(len(data.split), -1, dtype=np.int64)  # row -> position in the training view
        self.pos[train] = np.arange(len(train))
        self.probs = torch.from_numpy(np.asarray(data.probs[train], dtype=np.float32)).to(device)  # [n, M, K]
        self.target = torch.from_numpy(np.asarray(data.target[train], dtype=np.float32)).to(device)  # [n, K]
        self.mask = torch.from_numpy(np.asarray(data.option_mask[train], dtype=bool)).to(device)  # [n, K]
        self.agent = torch.tensor(agent, device=device)[:, None]  # [G, 1]

    def padded(self, rows: list[np.ndarray], width: int | None = None) -> np.ndarray:
        """[G, width] training-view positions of each head's rows, -1 = padding."""
        width = width or max(1, max(len(r) for r in rows))
        out = np.full((self.n_heads, width), -1, dtype=np.int64)
        for g, r in enumerate(rows):
            out[g, : len(r)] = self.pos[r[:width]]
        return out

    def terms(self, idx_np: np.ndarray) -> tuple[torch.Tensor, ...]:
        """x [G, b, Hmax], log p [G, b, K], target, option mask, valid [G, b] of positions [G, b]."""
        idx = to_device(idx_np, self.device)  # [G, b], -1 = padding
        valid = idx >= 0
        idx = idx.clamp_min(0)
        x = self.bank[self.agent, idx].float() * valid.unsqueeze(-1)  # [G, b, Hmax]
        logp = log_probs(self.probs[idx, self.agent], self.mask[idx])  # [G, b, K]
        return x, logp, self.target[idx], self.mask[idx], valid


def _head_means(nll: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Per-head mean of [G, b] over the valid positions: [G]."""
    return (nll * valid).sum(1) / valid.sum(1).clamp_min(1)


def _head_nll(net: nn.Module, batches: _HeadBatches, idx_np: np.ndarray) -> torch.Tensor:
    """Each head's mean NLL of its calibrated distribution on its positions: [G]."""
    x, logp, y, msk, valid = batches.terms(idx_np)
    return _head_means(nll(scaled(logp, net(x).float(), msk), y, msk), valid)


def _identity_nll(batches: _HeadBatches, idx_np: np.ndarray) -> list[float]:
    """Each head's mean NLL at T = 1 (the uncalibrated distribution): [G]."""
    with torch.no_grad():
        _, logp, y, msk, valid = batches.terms(idx_np)
        per_row = nll(torch.log_softmax(logp.masked_fill(~msk, -math.inf), -1), y, msk)  # [G, b]
        return _head_means(per_row, valid).tolist()


class _HeadStopping:
    """Per-head early stopping on the holdout NLL; each head's best state kept in memory."""

    def __init__(self, heads: TempHeads, nll: torch.Tensor, cfg: CalibrationConfig) -> None:
        self.heads, self.cfg = heads, cfg
        self.best = [[p.detach().clone() for p in head.parameters()] for head in heads.heads]
        self.best_nll = nll.cpu().clone()  # [G]
        self.bad = torch.zeros(len(heads.heads), dtype=torch.long, device="cpu")  # host bookkeeping

    @torch.no_grad()
    def after_epoch(self, nll: torch.Tensor, active: np.ndarray) -> np.ndarray:
        """Record improved heads' states; the heads still active afterwards ([G] bool)."""
        on = torch.from_numpy(active)
        improved = on & (nll.cpu() < self.best_nll - self.cfg.min_delta)  # [G]
        for g in np.flatnonzero(improved.numpy()):
            for bp, p in zip(self.best[g], self.heads.heads[g].parameters(), strict=True):
                bp.copy_(p)
        self.best_nll = torch.where(improved, nll.cpu(), self.best_nll)
        self.bad = torch.where(improved, torch.zeros_like(self.bad), self.bad + on.long())
        return active & (self.bad < self.cfg.patience).numpy()

    @torch.no_grad()
    def restore(self) -> None:
        for best, head in zip(self.best, self.heads.heads, strict=True):
            for bp, p in zip(best, head.parameters(), strict=True):
                p.copy_(bp)


class _CalibrationTraining:
    """The heads, their AdamW (one param group per head) and one epoch of batched training."""

    def __init__(self, fabric, heads: TempHeads, batches: _HeadBatches, plan: _HeadRows, cfg) -> None:
        groups = [{"params": list(head.parameters())} for head in heads.heads]
        opt = make_optimizer(groups, "adamw", cfg.lr, cfg.weight_decay, device=str(fabric.device))
        self.net, self.opt = fabric.setup(heads, opt)  # moves to env.device; forward under env.precision
        self.fabric, self.heads, self.batches, self.plan, self.cfg = fabric, heads, batches, plan, cfg

    def holdout_nll(self, hold_idx: np.ndarray) -> torch.Tensor:
        with torch.no_grad():
            return _head_nll(self.net, self.batches, hold_idx)  # [G]

    def epoch(self, epoch: int, active: np.ndarray) -> None:
        """One pass over every active head's rows, each in its own seeded order.

        A head whose rows ran out (or that is not active) rests: its gradients are dropped, so AdamW
        does not touch it.
        """
        bs = self.cfg.batch_size
        orders = [
            r[np.random.RandomState((self.cfg.seed + g) * 1000 + epoch).permutation(len(r))]
            for g, r in enumerate(self.plan.fit_rows)
        ]
        n_batches = np.array([math.ceil(len(r) / bs) for r in orders])
        order_idx = self.batches.padded(orders, int(n_batches.max(initial=1)) * bs)  # [G, nb * bs]
        for t in range(int(n_batches.max(initial=0))):
            step_on = active & (t < n_batches)  # [G]
            if not step_on.any():
                break
            idx_np = order_idx[:, t * bs : (t + 1) * bs].copy()
            idx_np[~step_on] = -1
            loss = _head_nll(self.net, self.batches, idx_np).sum()  # sum of per-head means
            self.opt.zero_grad(set_to_none=True)
            self.fabric.backward(loss)
            for g in np.flatnonzero(~step_on):
                for p in self.heads.heads[g].parameters():
                    p.grad = None
            clip_gradients(self.fabric, self.opt, self.cfg.clip, scope="group")
            self.opt.step()


def fit_calibration(data, cfg: CalibrationConfig, env: TrainEnv = TrainEnv()) -> dict:
    """Fit every agent's (per-role) temperature head on train + val; see module docstring.

    Raises:
        ValueError: `agents` naming a slot outside [0, M).
    """
    train = np.sort(np.concatenate([data.split_index("train"), data.split_index("val")]))  # training view
    plan = _head_rows(data, cfg, train)
    in_dims = [int(data.hidden[a].shape[1]) for a in plan.agent]
    fabric = make_fabric(env)
    heads = _heads(in_dims, cfg, init_device(fabric.device))
    batches = _HeadBatches(data, train, plan.agent, max(in_dims), fabric.device)
    training = _CalibrationTraining(fabric, heads, batches, plan, cfg)
    hold_idx = batches.padded(plan.hold_rows)
    nll_before = _identity_nll(batches, hold_idx)
    stopping = _HeadStopping(heads, training.holdout_nll(hold_idx), cfg)
    active = np.array(plan.fitted, dtype=bool)
    for epoch in range(cfg.epochs):
        if not active.any():
            break
        training.epoch(epoch, active)
        active = stopping.after_epoch(training.holdout_nll(hold_idx), active)
    stopping.restore()
    after = training.holdout_nll(hold_idx).tolist()
    return {
        "cfg": to_dict(cfg),
        "agent": plan.agent,  # [G] agent slot of each head
        "role": plan.role,  # [G] 0 = held the relevant context, 1 = everything else, -1 = all rows
        "fitted": plan.fitted,  # [G] False: too few rows, T = t0
        "params": heads.stacked(),  # stacked MLP parameters (head g = slice g), new tensors on the device
        "in_dims": in_dims,  # [G] hidden size of each head's agent
        "holdout_nll": [list(pair) for pair in zip(nll_before, after, strict=True)],  # [G] (before, after)
    }


def _temperatures(state: dict, data, rows: np.ndarray, dev: torch.device, batch: int) -> torch.Tensor:
    """Per-agent temperature [n, M] float32 on `dev` (t0 for unfitted roles, 1.0 for uncalibrated agents)."""
    m, cfg = data.n_agents, CalibrationConfig(**state["cfg"])
    temps = torch.ones(len(rows), m, dtype=torch.float32, device=dev)
    heads = _heads(state["in_dims"], cfg, dev, init=False)
    heads.load_stacked(state["params"])
    roles = _roles(data, cfg.by_role) if any(r >= 0 for r in state["role"]) else None
    agent_t = torch.tensor(state["agent"], device=dev)[:, None]  # [G, 1]
    for start in range(0, len(rows), batch):
        chunk = rows[start : start + batch]
        bank = stack_hidden(data.hidden, chunk)[:, :, : max(state["in_dims"])].to(dev)  # [M, n, Hmax]
        x = bank[agent_t, torch.arange(len(chunk), device=dev)[None, :]].float()  # [G, n, Hmax]
        with torch.no_grad():
            t = heads(x)  # [G, n]
        out = temps[start : start + len(chunk)]  # [n, M] view
        for g, (a, r) in enumerate(zip(state["agent"], state["role"], strict=True)):
            t_g = t[g] if state["fitted"][g] else torch.full_like(t[g], cfg.t0)
            if r < 0:
                out[:, a] = t_g
            else:
                sel = to_device(roles[chunk, a] == r, dev)  # [n] bool
                out[:, a] = torch.where(sel, t_g, out[:, a])
    return temps


def temperatures(
    state: dict, data, rows: np.ndarray, env: TrainEnv = TrainEnv(), batch: int = 4096
) -> np.ndarray:
    """Per-agent temperature [n, M] for the given rows (1.0 for uncalibrated agents / unfitted roles)."""
    rows = np.asarray(rows, dtype=np.int64)
    return _temperatures(state, data, rows, torch.device(env.device), batch).cpu().numpy()


def apply_calibration(state: dict, data, rows: np.ndarray, env: TrainEnv = TrainEnv()) -> np.ndarray:
    """Calibrated agent probs [n, M, K] = softmax(log p / T(x)) for the given rows (float32), computed on
    env.device."""
    rows, dev = np.asarray(rows, dtype=np.int64), torch.device(env.device)
    temps = _temperatures(state, data, rows, dev, 4096)  # [n, M]
    probs = torch.from_numpy(np.asarray(data.probs[rows], dtype=np.float32)).to(dev)  # [n, M, K]
    mask = torch.from_numpy(np.asarray(data.option_mask[rows], dtype=bool)).to(dev)  # [n, K]
    mask = mask[:, None, :].expand_as(probs)
    with torch.no_grad():
        out = scaled(log_probs(probs, mask), temps, mask).exp()  # [n, M, K]
    return out.cpu().numpy().astype(np.float32)


def agent_calibrator(state: dict, agent: int):
    """Agent `agent`'s calibration of one question at a time, from a run's calibration state: a function
    (probs [K], hidden [H], relevant) -> calibrated probs [K] float32, softmax(log p / T(hidden)) with the head
    apply_calibration uses for that agent and role (`relevant`: the agent held the question's relevant
    context; one head per role only where the run fitted them so). A live agent or a served pool reports
    what walla train pooled: the same heads, float32 inputs and scaling, on its own hidden state alone."""
    cfg = CalibrationConfig(**state["cfg"])
    heads = _heads(state["in_dims"], cfg, torch.device("cpu"), init=False).float()
    heads.load_stacked([p.float().cpu() for p in state["params"]])
    heads.eval()
    mine = [g for g, a in enumerate(state["agent"]) if a == agent]  # its heads: one, or one per role
    h_max = max(state["in_dims"])

    def calibrate(probs: np.ndarray, hidden: np.ndarray, relevant: bool = False) -> np.ndarray:
        p = torch.as_tensor(np.asarray(probs, dtype=np.float32))[None, None, :]  # [1, 1, K]
        mask = torch.ones_like(p, dtype=torch.bool)
        role = 0 if relevant else 1
        g = next((g for g in mine if state["role"][g] in (-1, role)), None)
        if g is None:  # an agent the run did not calibrate: T = 1, as apply_calibration leaves it
            t = torch.ones(1, 1)
        elif not state["fitted"][g]:  # too few rows for this role: T = t0
            t = torch.full((1, 1), float(cfg.t0))
        else:
            h = torch.as_tensor(np.asarray(hidden)).float().reshape(-1)[:h_max]
            x = torch.zeros(len(state["agent"]), 1, h_max)  # [G, 1, Hmax]: head g reads slice g
            x[g, 0, : h.numel()] = h
            with torch.no_grad():
                t = heads(x)[g : g + 1, :]  # [1, 1]
        with torch.no_grad():
            out = scaled(log_probs(p, mask), t, mask).exp()  # [1, 1, K]
        return out[0, 0].numpy().astype(np.float32)

    return calibrate
