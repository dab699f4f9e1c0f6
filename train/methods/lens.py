"""LENS (beyond the paper; Guo et al., arXiv 2507.23167): a per-agent linear confidence predictor, used as
pooling weights.

    z_i = [standardize_i(h_i), sort_desc(p_i)]          agent i's OWN hidden state + its option probs
    c_i = sigmoid(a_i . z_i + b_i)                       P(agent i's top option is right)
    fit: each agent alone, L2-regularized logistic regression on its train rows,
         mean_n BCE(c_i, correct_i) + l2 / (2 n) |a_i|^2     (l2 = 1: scikit-learn's default C = 1)
    weights = c_i / sum_j c_j                            linear pool of the agents' probs

The nearest published method to WALLA's heads: like them it is decentralized (no agent reads another's
features) and reads the hidden state, but it is trained on the agent's own correctness, not on a payout
against its peers. `correct_i` is the target's mass on the agent's top option (1/0 with hard labels, as
NIRTRouter's correctness). The probabilities enter sorted (largest first; absent options 0), so the
predictor does not depend on which letter the agent picked. The fit is convex and starts from zero, in
float64 on the host (full-batch L-BFGS, a fixed number of iterations): every seed gives the same state, so
its seed interval is 0, as the learning-free rows'; its result cannot depend on `--device`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from walla.manifests.validate import build, check, config, to_dict
from walla.train.method_io import as_rows, pooled_output
from walla.train.methods import LogFn, MethodOutput

STD_FLOOR = 1e-6  # a hidden unit constant on the train rows is left unscaled


@config
class Config:
    l2: float = 1.0  # ridge penalty l2 / (2 n) |a|^2 on the mean BCE (scikit-learn LogisticRegression C = 1)
    max_iter: int = 200  # L-BFGS iterations (full batch)
    use_hidden: bool = True  # the hidden state in the features (false: the option probabilities only)

    def __post_init__(self) -> None:
        check(self.l2 >= 0, "l2", ">= 0", self.l2)
        check(self.max_iter >= 1, "max_iter", ">= 1", self.max_iter)


def correct(probs: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Target mass on each agent's top option: probs [n, M, K], target [n, K] -> [n, M] float64."""
    top = probs.argmax(-1)  # [n, M]
    return np.take_along_axis(np.asarray(target, dtype=np.float64), top, axis=1)


def features(
    data, agent: int, rows: np.ndarray, stats: tuple[np.ndarray, np.ndarray] | None, cfg
) -> np.ndarray:
    """Agent `agent`'s own features on `rows`: [n, H + K] float64 (or [n, K] without the hidden state)."""
    p = np.sort(np.asarray(data.probs[rows, agent], dtype=np.float64), axis=-1)[:, ::-1]  # [n, K]
    if not cfg.use_hidden:
        return np.ascontiguousarray(p)
    h = np.asarray(data.hidden[agent][rows], dtype=np.float64)  # [n, H]
    mean, std = stats
    return np.concatenate([(h - mean) / std, p], axis=1)


def _hidden_stats(data, agent: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    h = np.asarray(data.hidden[agent][rows], dtype=np.float64)
    std = h.std(0)
    return h.mean(0), np.where(std > STD_FLOOR, std, 1.0)


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float, max_iter: int) -> tuple[np.ndarray, float]:
    """Ridge logistic regression from zero: x [n, d], y [n] in [0, 1] -> (a [d], b)."""
    xt = torch.from_numpy(np.ascontiguousarray(x))
    yt = torch.from_numpy(np.ascontiguousarray(y, dtype=np.float64))
    a = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS(
        [a, b],
        lr=1.0,
        max_iter=max_iter,
        tolerance_grad=1e-10,
        tolerance_change=1e-12,
        history_size=20,
        line_search_fn="strong_wolfe",
    )
    n = max(len(y), 1)

    def closure():
        opt.zero_grad()
        logits = xt @ a + b
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, yt)
        loss = loss + l2 / (2 * n) * (a * a).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return a.detach().numpy().copy(), float(b.detach())


def fit(data, cfg: Config, seeds: Sequence[int], env, logs: Sequence[LogFn | None]) -> list[dict]:
    """Each agent's predictor on its own train rows (the same for every seed: a convex fit from zero)."""
    train = data.split_index("train")
    if len(train) == 0:
        raise ValueError(f"scenario {data.name!r} has no train rows to fit LENS on")
    y = correct(np.asarray(data.probs[train]), np.asarray(data.target[train]))  # [n, M]
    agents = []
    for i in range(data.n_agents):
        stats = _hidden_stats(data, i, train) if cfg.use_hidden else None
        a, b = fit_logistic(features(data, i, train, stats, cfg), y[:, i], cfg.l2, cfg.max_iter)
        agents.append({"a": a, "b": b, "stats": stats})
    for log in logs or []:
        if log is not None:
            log({"step": 0, "train_correct": float(y.mean())})
    return [{"config": to_dict(cfg), "agents": agents} for _ in seeds]


def confidences(state: dict, data, rows: np.ndarray) -> np.ndarray:
    """Each agent's predicted P(correct) on `rows`: [n, M] float64."""
    cfg = build(Config, state["config"], "lens state")
    if len(state["agents"]) != data.n_agents:
        raise ValueError(f"state was fit with {len(state['agents'])} agents, scenario has {data.n_agents}")
    out = np.empty((len(rows), data.n_agents), dtype=np.float64)
    for i, ag in enumerate(state["agents"]):
        z = features(data, i, rows, ag["stats"], cfg) @ ag["a"] + ag["b"]
        out[:, i] = 1.0 / (1.0 + np.exp(-z))
    return out


def predict(state: dict, data, rows: np.ndarray, env) -> MethodOutput:
    rows = as_rows(rows, len(data.split))
    c = np.maximum(confidences(state, data, rows), 1e-12)  # [n, M]
    weights = torch.from_numpy(c / c.sum(-1, keepdims=True))
    return pooled_output(data, rows, weights, extras={"confidence": c.astype(np.float32)})
