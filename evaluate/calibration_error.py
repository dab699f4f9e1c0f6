"""The expected calibration error (ECE) of max-prob confidence: binning, plug-in and debiased estimators.

The tables' ECE is the debiased binned estimator (`ece_debiased`, Kumar, Liang & Ma 2019): SPEC §8's
plug-in `ece` is biased upward by its bins' noise (~0.08 for a perfectly calibrated predictor on 140
questions), so its bootstrap interval sat above it (issue 28); `ece` stays for the reliability plots. The
debiased one still reads high on few questions (about 0.05 to 0.07 for a calibrated predictor on 140:
`ece_debiased_resampled`), which the ECE interval allows for (bootstrap.calibration_interval, from the
null distribution `ece_calibrated_draws`; issue 37). Registered as the metric `ece` in metrics.py.

Shapes: N questions, K options; a set of B resamples is given as counts [N, B] (how often each question
is drawn in each resample).
"""

from __future__ import annotations

import numpy as np
from scipy import special

ECE_BINS = 20  # SPEC §8: 20 equal-width bins on [0, 1]


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


def ece_debiased(p_agg: np.ndarray, label: np.ndarray, n_bins: int = ECE_BINS) -> float:
    """The table's ECE: the 20-bin ECE with the bias of its |.| removed (see `ece_debiased_resampled`)."""
    return float(ece_debiased_resampled(p_agg, label, np.ones((len(label), 1)), n_bins)[0])


def ece_debiased_resampled(
    p_agg: np.ndarray, label: np.ndarray, counts: np.ndarray, n_bins: int = ECE_BINS
) -> np.ndarray:
    """Debiased 20-bin ECE on each resample of counts [N, B] -> [B] (Kumar, Liang & Ma 2019, "Verified
    uncertainty calibration", the normal-approximation bias correction of the binned plug-in ECE);
    p_agg [..., N, K] and label [..., N] may carry leading batch axes (-> [..., B]: the simulations).

    Why: |mean gap| of a bin of n_b questions is biased upward by about its noise, sd_b * sqrt(2/pi);
    on 140 questions and 20 bins a perfectly calibrated predictor shows a plug-in ECE of ~0.08. Per bin
    with gap g = acc_b - conf_b and sd s = sqrt(acc_b (1 - acc_b) / n_b) the corrected term is
    2 |g| - E|N(g, s^2)| (E|N| in closed form instead of the paper's Monte-Carlo draws; a bin whose
    answers are all right or all wrong gets no correction, s = 0), weighted by n_b / N; the sum is
    clipped at 0, since an ECE below 0 means nothing.

    The correction is one step, evaluated at the noisy gap, so it removes only part of the bias where
    bins are small: a perfectly calibrated predictor still reads about 0.05 (2 options) to 0.07 (4
    options) on 140 questions and 0.02 on 1000 (its plug-in: 0.08 to 0.11 and 0.03 to 0.04), and a gap of
    0.10 reads 0.003-0.004 low on 1000 (benchmarks/marks_coverage.py prints these); the interval
    (`bootstrap.calibration_interval`) is built to cover the population ECE despite this.
    """
    member = _bin_members(p_agg, n_bins)  # [..., bins, N]
    conf = np.max(p_agg, axis=-1).astype(np.float64)[..., None, :]  # [..., 1, N]
    correct = (np.argmax(p_agg, axis=-1) == label).astype(np.float64)[..., None, :]  # [..., 1, N]
    sums = np.concatenate([member, member * correct, member * conf], axis=-2) @ counts  # [..., 3 bins, B]
    return _debiased_from_sums(*np.split(sums, 3, axis=-2))


def ece_calibrated_draws(p_agg: np.ndarray, uniforms: np.ndarray, n_bins: int = ECE_BINS) -> np.ndarray:
    """The debiased ECE of a perfectly calibrated predictor with these confidences, on B label draws:
    question i is right when uniforms[i, b] < its confidence; p_agg [..., N, K], uniforms [N, B] ->
    [..., B]. The spread of this null distribution says how large an ECE noise alone produces (its lower
    limit is 0), bias included."""
    conf = np.max(p_agg, axis=-1).astype(np.float64)  # [..., N]
    member = _bin_members(p_agg, n_bins)  # [..., bins, N]
    n = member.sum(-1, keepdims=True)  # [..., bins, 1]
    right = member @ (uniforms < conf[..., None]).astype(np.float64)  # [..., bins, B]
    return _debiased_from_sums(
        np.broadcast_to(n, right.shape), right, np.broadcast_to(member @ conf[..., None], right.shape)
    )


def _bin_members(p_agg: np.ndarray, n_bins: int) -> np.ndarray:
    """[..., bins, N] 1.0 where question n's max-prob confidence falls in bin b."""
    idx = confidence_bins(np.max(p_agg, axis=-1).astype(np.float64), n_bins)  # [..., N]
    return (idx[..., None, :] == np.arange(n_bins)[:, None]).astype(np.float64)


def _debiased_from_sums(n: np.ndarray, right: np.ndarray, conf: np.ndarray) -> np.ndarray:
    """Per-bin counts, sums of correctness and of confidence [..., bins, B] -> debiased ECE [..., B]."""
    with np.errstate(invalid="ignore", divide="ignore"):
        acc, gap = right / n, (right - conf) / n  # [..., bins, B], NaN in empty bins
        sd = np.sqrt(acc * (1.0 - acc) / n)
        z = gap / sd
        folded = sd * np.sqrt(2.0 / np.pi) * np.exp(-0.5 * z * z) + gap * (1.0 - 2.0 * special.ndtr(-z))
        expected = np.where(sd > 0, folded, np.abs(gap))  # E|N(gap, sd^2)|
        terms = np.where(n > 0, n * (2.0 * np.abs(gap) - expected), 0.0)  # [..., bins, B]
        return np.maximum(terms.sum(-2) / n.sum(-2), 0.0)
