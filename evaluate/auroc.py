"""AUROC on numpy arrays, on the questions as given or on B resamples of them at once.

    auc(p_agg, label)                      # selective prediction: max prob as a predictor of correctness
    class_auc(p_agg, label)                # the usual class AUROC of a binary task
    weighted_auc(score, positive, counts)  # either, on every resample of counts [N, B] -> [B]

An AUROC is not a mean over questions, so the bootstrap over questions (intervals/bootstrap.py) cannot re-weight
per-question terms: the `*_resampled` forms recompute it on every resample, and agree with the plain
function on the resampled questions (tests/evaluate/test_eval_bootstrap.py). Registered as the metrics
`auc` and `class_auc` in metrics.py.

Shapes: N questions, K options; a set of B resamples is given as counts [N, B] (how often each question
is drawn in each resample; questions first, so per-question gathers and running sums move whole rows).
"""

from __future__ import annotations

import numpy as np


def auc(p_agg: np.ndarray, label: np.ndarray) -> float:
    """Selective-prediction AUROC: max_k p_agg as a predictor of correctness (SPEC §8, §10.9).

    NaN when every prediction is correct or every one is wrong (AUROC undefined).
    """
    return float(auc_resampled(p_agg, label, np.ones((len(label), 1)))[0])


def auc_resampled(p_agg: np.ndarray, label: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """`auc` on each resample of counts [N, B] -> [B]."""
    return weighted_auc(np.max(p_agg, axis=-1), np.argmax(p_agg, axis=-1) == label, counts)


def weighted_auc(score: np.ndarray, positive: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """AUROC of score [N] for positive [N] on each resample, a question drawn c times counting c times
    (sklearn's roc_auc_score on the resampled rows) -> [B]; NaN where a resample lacks either class.

    Mann-Whitney form: sum over drawn positives of (drawn negatives scored strictly below it + half those
    tied with it), over #positives x #negatives. The negatives are sorted by score once; a running count
    of drawn negatives, read where each positive's score falls (left and right of ties), gives both terms
    for every resample. Counts are integers, so numerator and denominator are exact in float64.
    """
    negatives = np.flatnonzero(~positive)
    order = np.argsort(score[negatives], kind="stable")
    ranked = score[negatives][order]  # negative scores, ascending
    running = np.zeros((len(negatives) + 1, counts.shape[1]))  # [Nn + 1, B]
    np.cumsum(counts[negatives[order]], axis=0, out=running[1:])  # drawn negatives among the j lowest
    below = running[np.searchsorted(ranked, score[positive], side="left")]  # [P, B] scored < the positive
    upto = running[np.searchsorted(ranked, score[positive], side="right")]  # [P, B] scored <= it
    drawn = counts[positive]  # [P, B]
    pairs = drawn.sum(0) * running[-1]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(pairs > 0, 0.5 * np.einsum("pb,pb->b", drawn, below + upto) / pairs, np.nan)


def class_auc(p_agg: np.ndarray, label: np.ndarray) -> float:
    """Usual class AUROC for binary tasks: p_agg[:, 1] as the score of label == 1. NaN if K != 2 or one class."""
    return float(class_auc_resampled(p_agg, label, np.ones((len(label), 1)))[0])


def class_auc_resampled(p_agg: np.ndarray, label: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """`class_auc` on each resample of counts [N, B] -> [B]."""
    if p_agg.shape[-1] != 2:
        return np.full(counts.shape[1], np.nan)
    return weighted_auc(p_agg[:, 1], label == 1, counts)
