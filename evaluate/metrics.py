"""Every metric of the paper's tables (SPEC §8, with the fixes of §10), on numpy arrays.

Each metric is a plain function of arrays; `METRICS` registers it with the metadata the tables need
(higher_is_better to mark the best value, the display scale x100 / x1, which datasets it applies to),
the way lm-eval's `register_metric` does. `compute_metrics(arrays)` evaluates every registered metric
on one `EvalArrays` (one method, one seed, one question subset).

Scoring goes through `walla.train.mechanism` (the single source of the Brier score): the unhalved Brier
E_{Y~y}||p - delta_Y||^2 is `-brier_score(p, y, c1=0, c2=1)`. With a one-hot y it is sum_k (p_k - y_k)^2;
with a soft y (BayesX) it is the expected Brier 1 + sum p^2 - 2 <p, y> (SPEC §5.2). Both differ only by a
per-question constant, so D-Regret, MRR and Kendall tau are the same under either reading.

Most metrics are a mean over questions of a per-question term (`*_terms` below; the registry's value is
their mean): the bootstrap over questions (intervals/bootstrap.py) re-weights those terms. AUC and ECE are not such
means; they have `*_resampled` forms that recompute them on every resample at once; either form agrees
with the plain function on the resampled questions (tests/evaluate/test_eval_bootstrap.py). The AUROC
estimators are evaluate/auroc.py; the ECE estimators, and why the tables' ECE is the debiased one,
evaluate/calibration_error.py.

Shapes: N questions, M agents, K options; a set of B resamples is given as counts [N, B] (how often
each question is drawn in each resample).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from walla.evaluate.auroc import auc, auc_resampled, class_auc, class_auc_resampled
from walla.evaluate.calibration_error import ece_calibrated_draws, ece_debiased, ece_debiased_resampled
from walla.train.mechanism import brier_score, regret

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


def accuracy_terms(p_agg: np.ndarray, label: np.ndarray) -> np.ndarray:
    """[N] 1.0 where argmax p_agg == label (ties: lowest option index, as np.argmax), else 0.0."""
    return (np.argmax(p_agg, axis=-1) == label).astype(np.float64)


def nll_terms(p_agg: np.ndarray, label: np.ndarray) -> np.ndarray:
    """[N] -log(p_agg[label] + 1e-10)."""
    p = np.take_along_axis(p_agg, label[:, None], axis=-1)[:, 0].astype(np.float64)
    return -np.log(p + NLL_EPS)


# ----------------------------------------------------------------------------------------- weight metrics


def mrr_terms(weights: np.ndarray, agent_brier: np.ndarray) -> np.ndarray:
    """[N] reciprocal rank of the best agent (argmin Brier, lowest index on ties) in the weight ordering.

    The ordering is a STABLE descending sort of the weights (ties: lower agent index first), so
    rank = 1 + #{j: w_j > w_best} + #{j < best: w_j == w_best}. Uniform weights give 1/(best + 1).
    """
    n, m = weights.shape
    best = np.argmin(agent_brier, axis=-1)  # [N]
    w_best = weights[np.arange(n), best][:, None]  # [N, 1]
    before = (weights > w_best) | ((weights == w_best) & (np.arange(m)[None, :] < best[:, None]))  # [N, M]
    return 1.0 / (1.0 + before.sum(-1))


def kendall_tau_terms(weights: np.ndarray, agent_brier: np.ndarray) -> np.ndarray:
    """[N] Kendall tau-a between weights and -Brier per question over all C(M,2) pairs.

    tau = (#concordant - #discordant) / C(M,2); a tie in either ordering contributes 0 (so uniform weights
    give 0). NaN for M < 2.
    """
    m = weights.shape[-1]
    if m < 2:
        return np.full(len(weights), np.nan)
    i, j = np.triu_indices(m, k=1)  # the C(M,2) pairs
    dw = np.sign(weights[:, i] - weights[:, j])  # [N, P]
    ds = np.sign(agent_brier[:, j] - agent_brier[:, i])  # [N, P] sign of (-B_i) - (-B_j)
    return (dw * ds).sum(-1) / len(i)


def inverse_hhi_terms(weights: np.ndarray) -> np.ndarray:
    """[N] effective number of agents (sum w)^2 / sum w^2 (M for uniform, 1 for one-hot)."""
    w = weights.astype(np.float64)
    return w.sum(-1) ** 2 / (w * w).sum(-1)


def regret_terms(agg_brier: np.ndarray, agent_brier: np.ndarray) -> np.ndarray:
    """[N] mechanism.regret (the one D-regret formula) per question."""
    return regret(torch.from_numpy(agg_brier), torch.from_numpy(agent_brier)).numpy()


# ----------------------------------------------------------------------------------------- binary-target metrics


def _bernoulli(pred: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p = np.clip(np.asarray(pred, dtype=np.float64), KL_CLIP, 1 - KL_CLIP)
    t = np.clip(np.asarray(target, dtype=np.float64), KL_CLIP, 1 - KL_CLIP)
    return p, t


def bernoulli_kld_terms(pred: np.ndarray, target: np.ndarray) -> np.ndarray:
    """[N] KL(Bernoulli(target) || Bernoulli(pred)), both clipped to [1e-10, 1 - 1e-10]."""
    p, t = _bernoulli(pred, target)
    return t * np.log(t / p) + (1 - t) * np.log((1 - t) / (1 - p))


def bernoulli_tvd_terms(pred: np.ndarray, target: np.ndarray) -> np.ndarray:
    """[N] total variation |pred - target| between two Bernoulli distributions."""
    return np.abs(np.asarray(pred, np.float64) - np.asarray(target, np.float64))


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


Terms = Callable[[EvalArrays], np.ndarray]  # one method/seed -> [N] per-question terms
Resampled = Callable[[EvalArrays, np.ndarray], np.ndarray]  # (arrays, counts [N, B]) -> [B]


def _binary_terms(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Terms:
    """KLD/TVD on the probability of option 0 (both are symmetric under swapping the two classes)."""

    def terms(a: EvalArrays) -> np.ndarray:
        if a.p_agg.shape[-1] != 2:
            return np.full(len(a.label), np.nan)
        return fn(a.p_agg[:, 0], a.target[:, 0])

    return terms


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
    terms: Terms | None = field(default=None, repr=False, compare=False)  # set: compute = mean of terms
    resampled: Resampled | None = field(default=None, repr=False, compare=False)  # non-additive metrics
    scored_on_agents: bool = False  # the value depends on which agent probabilities a row is scored against
    # a calibration error: its value on label draws from a perfectly calibrated predictor with the same
    # confidences (arrays, uniforms [N, B]) -> [B]; set, the question interval's lower end subtracts that
    # null's 97.5% quantile from the estimate, reaching 0 within it (bootstrap.calibration_interval)
    calibrated_draws: Callable[[EvalArrays, np.ndarray], np.ndarray] | None = field(
        default=None, repr=False, compare=False
    )


def additive(name: str, label: str, terms: Terms, higher_is_better: bool | None, **kw) -> MetricInfo:
    """A metric that is the mean over questions of per-question terms (so the bootstrap re-weights them)."""
    return MetricInfo(name, label, lambda a: float(np.mean(terms(a))), higher_is_better, terms=terms, **kw)


HARD, SOFT = frozenset({"hard"}), frozenset({"soft"})

METRICS: dict[str, MetricInfo] = {
    m.name: m
    for m in [
        MetricInfo(
            "auc",
            "AUC",
            lambda a: auc(a.p_agg, a.label),
            True,
            applies=HARD,
            description="AUROC of max aggregated probability as a predictor of correctness",
            resampled=lambda a, c: auc_resampled(a.p_agg, a.label, c),
        ),
        additive("accuracy", "ACC", lambda a: accuracy_terms(a.p_agg, a.label), True, applies=HARD),
        MetricInfo(
            "ece",
            "ECE",
            lambda a: ece_debiased(a.p_agg, a.label),
            False,
            applies=HARD,
            description="20-bin expected calibration error of max-prob confidence, debiased (Kumar et al. 2019)",
            resampled=lambda a, c: ece_debiased_resampled(a.p_agg, a.label, c),
            calibrated_draws=lambda a, u: ece_calibrated_draws(a.p_agg, u),
        ),
        additive(
            "kld",
            "KLD",
            _binary_terms(bernoulli_kld_terms),
            False,
            applies=SOFT,
            description="KL(Bernoulli(target) || Bernoulli(aggregate))",
        ),
        additive(
            "tvd",
            "TVD",
            _binary_terms(bernoulli_tvd_terms),
            False,
            applies=SOFT,
            description="|aggregate - target| on a binary outcome",
        ),
        additive(
            "mrr",
            "MRR",
            lambda a: mrr_terms(a.weights, a.agent_brier),
            True,
            description="reciprocal rank of the per-question best agent (Brier) under the weights",
            scored_on_agents=True,
        ),
        additive(
            "kendall_tau",
            "K-Tau",
            lambda a: kendall_tau_terms(a.weights, a.agent_brier),
            True,
            applies=HARD,
            description="Kendall tau-a between weights and -Brier, per question",
            scored_on_agents=True,
        ),
        additive(
            "d_regret",
            "DRegret",
            lambda a: regret_terms(a.agg_brier, a.agent_brier),
            False,
            description="Brier(aggregate) - min_i Brier(agent i), per question",
            scored_on_agents=True,
        ),
        MetricInfo(
            "class_auc",
            "Class AUC",
            lambda a: class_auc(a.p_agg, a.label),
            True,
            applies=frozenset(),
            description="usual AUROC of P(option 1) for label 1 (binary tasks)",
            resampled=lambda a, c: class_auc_resampled(a.p_agg, a.label, c),
        ),
        additive(
            "nll",
            "NLL",
            lambda a: nll_terms(a.p_agg, a.label),
            False,
            scale=1.0,
            decimals=4,
            applies=frozenset(),
        ),
        additive("brier", "Brier", lambda a: a.agg_brier, False, scale=1.0, decimals=4, applies=frozenset()),
        additive(
            "inverse_hhi",
            "Inv. HHI",
            lambda a: inverse_hhi_terms(a.weights),
            None,
            scale=1.0,
            decimals=4,
            applies=frozenset(),
            description="effective number of agents (sum w)^2 / sum w^2",
        ),
    ]
}

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
