"""Every metric of the paper's tables (SPEC §8, with the fixes of §10), on numpy arrays.

Each metric is a plain function of arrays; `METRICS` registers it with the metadata the tables need
(higher_is_better to mark the best value, the display scale x100 / x1, which datasets it applies to),
the way lm-eval's `register_metric` does. `compute_metrics(arrays)` evaluates every registered metric
on one `EvalArrays` (one method, one seed, one question subset).

Scoring goes through `walla.train.mechanism` (the single source of the Brier score): the unhalved Brier
E_{Y~y}||p - delta_Y||^2 is `-brier_score(p, y, c1=0, c2=1)`. With a one-hot y it is sum_k (p_k - y_k)^2;
with a soft y (BayesX) it is the expected Brier 1 + sum p^2 - 2 <p, y> (SPEC §5.2). Both differ only by a
per-question constant, so D-Regret, MRR and Kendall tau are the same under either reading.

Shapes: N questions, M agents, K options.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from sklearn.metrics import roc_auc_score
from walla.train.mechanism import brier_score, regret

ECE_BINS = 20  # SPEC §8: 20 equal-width bins on [0, 1]
NLL_EPS = 1e-10  # SPEC §8: -log(p[label] + 1e-10)
KL_CLIP = 1e-10  # SPEC §8: Bernoulli parameters clipped to [1e-10, 1 - 1e-10]


# ----------------------------------------------------------------------------------------- scoring


def brier(probs: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Unhalved Brier E_{Y~target}||p - delta_Y||^2 of probs[..., K] vs target[..., K] -> [...] float64."""
    p = torch.from_numpy(np.ascontiguousarray(probs, dtype=np.float64))
    q = torch.from_numpy(np.ascontiguousarray(target, dtype=np.float64))
    return (-brier_score(p, q, c1=0.0, c2=1.0)).numpy()  # s = 0 - 1 * E||p - d||^2


def per_agent_brier(probs: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Brier of every agent: probs [N, M, K], target [N, K] -> [N, M]."""
    return brier(probs, np.broadcast_to(target[:, None, :], probs.shape))


# ----------------------------------------------------------------------------------------- hard-label metrics


def accuracy(p_agg: np.ndarray, label: np.ndarray) -> float:
    """Mean 1[argmax p_agg == label] (ties: lowest option index, as np.argmax)."""
    return float(np.mean(np.argmax(p_agg, axis=-1) == label))


def auc(p_agg: np.ndarray, label: np.ndarray) -> float:
    """Selective-prediction AUROC: max_k p_agg as a predictor of correctness (SPEC §8, §10.9).

    NaN when every prediction is correct or every one is wrong (AUROC undefined).
    """
    correct = np.argmax(p_agg, axis=-1) == label  # [N]
    if correct.all() or not correct.any():
        return float("nan")
    return float(roc_auc_score(correct, np.max(p_agg, axis=-1)))


def class_auc(p_agg: np.ndarray, label: np.ndarray) -> float:
    """Usual class AUROC for binary tasks: p_agg[:, 1] as the score of label == 1. NaN if K != 2 or one class."""
    if p_agg.shape[-1] != 2:
        return float("nan")
    positive = label == 1
    if positive.all() or not positive.any():
        return float("nan")
    return float(roc_auc_score(positive, p_agg[:, 1]))


def confidence_bins(confidence: np.ndarray, n_bins: int = ECE_BINS) -> np.ndarray:
    """Bin index of each confidence: first bin [0, 1/n], the others (lo, hi] (SPEC §8).

    Edges come from np.linspace so a value exactly on an edge (0.05, 0.15, ...) falls in the bin it closes.
    """
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    # number of upper edges strictly below c = index of the (lo, hi] bin holding c; 0 for c <= edges[1]
    return np.minimum(np.searchsorted(edges[1:], confidence, side="left"), n_bins - 1)


def reliability(
    p_agg: np.ndarray, label: np.ndarray, n_bins: int = ECE_BINS
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-bin (count, mean confidence, accuracy) of max-prob confidence; NaN means for empty bins."""
    conf = np.max(p_agg, axis=-1).astype(np.float64)  # [N]
    correct = (np.argmax(p_agg, axis=-1) == label).astype(np.float64)  # [N]
    idx = confidence_bins(conf, n_bins)
    count = np.bincount(idx, minlength=n_bins).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.bincount(idx, weights=conf, minlength=n_bins) / count
        acc = np.bincount(idx, weights=correct, minlength=n_bins) / count
    return count, mean_conf, acc


def ece(p_agg: np.ndarray, label: np.ndarray, n_bins: int = ECE_BINS) -> float:
    """Expected calibration error: sum_b (n_b / N) |acc_b - conf_b| over max-prob confidence bins."""
    count, mean_conf, acc = reliability(p_agg, label, n_bins)
    used = count > 0
    return float(np.sum(count[used] / count.sum() * np.abs(acc[used] - mean_conf[used])))


def nll(p_agg: np.ndarray, label: np.ndarray) -> float:
    """-mean log(p_agg[label] + 1e-10)."""
    p = np.take_along_axis(p_agg, label[:, None], axis=-1)[:, 0].astype(np.float64)
    return float(-np.mean(np.log(p + NLL_EPS)))


# ----------------------------------------------------------------------------------------- weight metrics


def mrr(weights: np.ndarray, agent_brier: np.ndarray) -> float:
    """Mean reciprocal rank of the best agent (argmin Brier, lowest index on ties) in the weight ordering.

    The ordering is a STABLE descending sort of the weights (ties: lower agent index first), so
    rank = 1 + #{j: w_j > w_best} + #{j < best: w_j == w_best}. Uniform weights give 1/(best + 1).
    """
    n, m = weights.shape
    best = np.argmin(agent_brier, axis=-1)  # [N]
    w_best = weights[np.arange(n), best][:, None]  # [N, 1]
    before = (weights > w_best) | ((weights == w_best) & (np.arange(m)[None, :] < best[:, None]))  # [N, M]
    return float(np.mean(1.0 / (1.0 + before.sum(-1))))


def kendall_tau(weights: np.ndarray, agent_brier: np.ndarray) -> float:
    """Kendall tau-a between weights and -Brier per question over all C(M,2) pairs, averaged over questions.

    tau = (#concordant - #discordant) / C(M,2); a tie in either ordering contributes 0 (so uniform weights
    give 0). NaN for M < 2.
    """
    m = weights.shape[-1]
    if m < 2:
        return float("nan")
    i, j = np.triu_indices(m, k=1)  # the C(M,2) pairs
    dw = np.sign(weights[:, i] - weights[:, j])  # [N, P]
    ds = np.sign(agent_brier[:, j] - agent_brier[:, i])  # [N, P] sign of (-B_i) - (-B_j)
    return float(np.mean((dw * ds).sum(-1) / len(i)))


def inverse_hhi(weights: np.ndarray) -> float:
    """Mean effective number of agents (sum w)^2 / sum w^2 (M for uniform, 1 for one-hot)."""
    w = weights.astype(np.float64)
    return float(np.mean(w.sum(-1) ** 2 / (w * w).sum(-1)))


def dynamic_regret(p_agg: np.ndarray, probs: np.ndarray, target: np.ndarray) -> float:
    """Mean over questions of Brier(p_agg) - min_i Brier(p_i) (unhalved; per-question best agent)."""
    return _regret(brier(p_agg, target), per_agent_brier(probs, target))


def _regret(agg_brier: np.ndarray, agent_brier: np.ndarray) -> float:
    """Mean of mechanism.regret (the one D-regret formula) over questions."""
    return float(regret(torch.from_numpy(agg_brier), torch.from_numpy(agent_brier)).mean())


# ----------------------------------------------------------------------------------------- binary-target metrics


def _bernoulli(pred: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p = np.clip(np.asarray(pred, dtype=np.float64), KL_CLIP, 1 - KL_CLIP)
    t = np.clip(np.asarray(target, dtype=np.float64), KL_CLIP, 1 - KL_CLIP)
    return p, t


def bernoulli_kld(pred: np.ndarray, target: np.ndarray) -> float:
    """Mean KL(Bernoulli(target) || Bernoulli(pred)), both clipped to [1e-10, 1 - 1e-10]."""
    p, t = _bernoulli(pred, target)
    return float(np.mean(t * np.log(t / p) + (1 - t) * np.log((1 - t) / (1 - p))))


def bernoulli_tvd(pred: np.ndarray, target: np.ndarray) -> float:
    """Mean total variation |pred - target| between two Bernoulli distributions."""
    return float(np.mean(np.abs(np.asarray(pred, np.float64) - np.asarray(target, np.float64))))


# ----------------------------------------------------------------------------------------- subsets, wagers


def hard_subset(probs: np.ndarray, label: np.ndarray) -> np.ndarray:
    """[N] bool: questions at least one agent gets wrong (drop those EVERY agent answers correctly)."""
    return (np.argmax(probs, axis=-1) != label[:, None]).any(-1)


def mean_per_agent(values: np.ndarray) -> np.ndarray:
    """Mean over questions of a per-agent column (wagers, net payouts): [N, M] -> [M]."""
    return np.mean(values.astype(np.float64), axis=0)


# ----------------------------------------------------------------------------------------- registry


@dataclass
class EvalArrays:
    """What one method produced for one seed on one question subset, plus the ground truth."""

    p_agg: np.ndarray  # [N, K] aggregated prediction
    probs: np.ndarray  # [N, M, K] the agents' probabilities that were pooled
    weights: np.ndarray  # [N, M] aggregation weights (rows sum to 1)
    label: np.ndarray  # [N] int, 0-based correct option
    target: np.ndarray  # [N, K] soft gold distribution or one-hot(label)
    _agent_brier: np.ndarray | None = field(default=None, repr=False)  # [N, M] cache (may be passed in)
    _agg_brier: np.ndarray | None = field(default=None, repr=False)  # [N] cache

    @property
    def agent_brier(self) -> np.ndarray:  # [N, M]: MRR, Kendall tau and D-Regret all need it
        if self._agent_brier is None:
            self._agent_brier = per_agent_brier(self.probs, self.target)
        return self._agent_brier

    @property
    def agg_brier(self) -> np.ndarray:  # [N]: Brier and D-Regret
        if self._agg_brier is None:
            self._agg_brier = brier(self.p_agg, self.target)
        return self._agg_brier

    def subset(self, mask: np.ndarray) -> EvalArrays:
        """The same arrays on a subset of questions (caches sliced, not recomputed)."""
        ab = None if self._agent_brier is None else self._agent_brier[mask]
        gb = None if self._agg_brier is None else self._agg_brier[mask]
        return EvalArrays(
            self.p_agg[mask],
            self.probs[mask],
            self.weights[mask],
            self.label[mask],
            self.target[mask],
            ab,
            gb,
        )


def _binary_metric(fn: Callable[[np.ndarray, np.ndarray], float]) -> Callable[[EvalArrays], float]:
    """KLD/TVD on the probability of option 0 (both are symmetric under swapping the two classes)."""

    def compute(a: EvalArrays) -> float:
        if a.p_agg.shape[-1] != 2:
            return float("nan")
        return fn(a.p_agg[:, 0], a.target[:, 0])

    return compute


def _d_regret(a: EvalArrays) -> float:
    """dynamic_regret reusing the cached per-agent Brier."""
    return _regret(a.agg_brier, a.agent_brier)


@dataclass(frozen=True)
class MetricInfo:
    name: str
    label: str  # column header in the tables
    compute: Callable[[EvalArrays], float] = field(repr=False, compare=False)
    higher_is_better: bool | None  # None: no direction (tables bold nothing)
    scale: float = 100.0  # display factor (SPEC §4.5: x100 for the paper's metrics, x1 otherwise)
    decimals: int = 2
    applies: frozenset[str] = frozenset({"hard", "soft"})  # dataset kinds whose tables show it
    description: str = ""


HARD, SOFT = frozenset({"hard"}), frozenset({"soft"})

METRICS: dict[str, MetricInfo] = {
    m.name: m
    for m in [
        MetricInfo("auc", "AUC", lambda a: auc(a.p_agg, a.label), True, applies=HARD,
                   description="AUROC of max aggregated probability as a predictor of correctness"),
        MetricInfo("accuracy", "ACC", lambda a: accuracy(a.p_agg, a.label), True, applies=HARD),
        MetricInfo("ece", "ECE", lambda a: ece(a.p_agg, a.label), False, applies=HARD,
                   description="20-bin expected calibration error of max-prob confidence"),
        MetricInfo("kld", "KLD", _binary_metric(bernoulli_kld), False, applies=SOFT,
                   description="KL(Bernoulli(target) || Bernoulli(aggregate))"),
        MetricInfo("tvd", "TVD", _binary_metric(bernoulli_tvd), False, applies=SOFT,
                   description="|aggregate - target| on a binary outcome"),
        MetricInfo("mrr", "MRR", lambda a: mrr(a.weights, a.agent_brier), True,
                   description="reciprocal rank of the per-question best agent (Brier) under the weights"),
        MetricInfo("kendall_tau", "K-Tau", lambda a: kendall_tau(a.weights, a.agent_brier), True, applies=HARD,
                   description="Kendall tau-a between weights and -Brier, per question"),
        MetricInfo("d_regret", "DRegret", lambda a: _d_regret(a), False,
                   description="Brier(aggregate) - min_i Brier(agent i), per question"),
        MetricInfo("class_auc", "Class AUC", lambda a: class_auc(a.p_agg, a.label), True, applies=frozenset(),
                   description="usual AUROC of P(option 1) for label 1 (binary tasks)"),
        MetricInfo("nll", "NLL", lambda a: nll(a.p_agg, a.label), False, 1.0, 4, frozenset()),
        MetricInfo("brier", "Brier", lambda a: float(np.mean(a.agg_brier)), False, 1.0, 4,
                   frozenset()),
        MetricInfo("inverse_hhi", "Inv. HHI", lambda a: inverse_hhi(a.weights), None, 1.0, 4, frozenset(),
                   description="effective number of agents (sum w)^2 / sum w^2"),
    ]
}  # fmt: skip

MAIN_COLUMNS = {  # the paper's column order per dataset kind
    "hard": ["auc", "accuracy", "ece", "mrr", "kendall_tau", "d_regret"],
    "soft": ["kld", "tvd", "mrr", "d_regret"],
}
EXTRA_COLUMNS = ["nll", "brier", "inverse_hhi", "class_auc"]  # the "other metrics" table


def compute_metrics(arrays: EvalArrays, names: list[str] | None = None) -> dict[str, float]:
    """Every registered metric (or `names`) on one EvalArrays; NaN where a metric is undefined."""
    if len(arrays.label) == 0:
        return {name: float("nan") for name in names or METRICS}
    return {name: METRICS[name].compute(arrays) for name in names or METRICS}
