"""Every metric against scikit-learn / scipy and against small cases computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import roc_auc_score
from walla.evaluate import auroc as A
from walla.evaluate import calibration_error as C
from walla.evaluate import metrics as M


def _rand_probs(rng, *shape):
    x = rng.gamma(1.0, size=shape)
    return x / x.sum(-1, keepdims=True)


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def test_accuracy_hand_case_and_tie_goes_to_lowest_option():
    p = np.array([[0.7, 0.3], [0.5, 0.5], [0.2, 0.8], [0.1, 0.9]])
    assert M.accuracy_terms(p, np.array([0, 0, 0, 1])).mean() == 0.75  # the 0.5/0.5 tie predicts option 0


def test_auc_is_correctness_vs_confidence_auroc(rng):
    p = _rand_probs(rng, 300, 4)
    label = rng.integers(0, 4, 300)
    correct = p.argmax(-1) == label
    assert A.auc(p, label) == pytest.approx(roc_auc_score(correct, p.max(-1)))
    # hand case: correct confidences {0.9, 0.6}, wrong {0.7} -> 1 of 2 pairs ordered
    p = np.array([[0.9, 0.1], [0.6, 0.4], [0.3, 0.7]])
    assert A.auc(p, np.array([0, 0, 0])) == 0.5


def test_auc_nan_when_all_correct_or_all_wrong():
    p = np.array([[0.9, 0.1], [0.8, 0.2]])
    assert np.isnan(A.auc(p, np.array([0, 0])))
    assert np.isnan(A.auc(p, np.array([1, 1])))


def test_class_auc_binary_only(rng):
    p = _rand_probs(rng, 200, 2)
    label = rng.integers(0, 2, 200)
    assert A.class_auc(p, label) == pytest.approx(roc_auc_score(label, p[:, 1]))
    assert np.isnan(A.class_auc(_rand_probs(rng, 10, 3), rng.integers(0, 3, 10)))
    assert np.isnan(A.class_auc(p[:3], np.array([1, 1, 1])))


def test_confidence_bins_first_bin_closed_and_edges_close_their_bin():
    c = np.array([0.0, 0.03, 0.05, 0.050001, 0.1, 0.15, 0.150001, 0.5, 0.95, 0.99, 1.0])
    assert C.confidence_bins(c).tolist() == [0, 0, 0, 1, 1, 2, 3, 9, 18, 19, 19]


def test_ece_hand_case():
    # confidences 0.9 (right), 0.9 (wrong), 0.7 (right), 0.6 (right): bins (0.85,0.9], (0.65,0.7], (0.55,0.6]
    p = np.array([[0.9, 0.1], [0.9, 0.1], [0.3, 0.7], [0.6, 0.4]])
    label = np.array([0, 1, 1, 0])
    expected = 2 / 4 * abs(0.5 - 0.9) + 1 / 4 * abs(1 - 0.7) + 1 / 4 * abs(1 - 0.6)
    assert C.ece(p, label) == pytest.approx(expected)


def test_ece_first_bin_edge_at_0_05_and_value_on_an_edge():
    # 20 options, uniform -> confidence exactly 0.05 -> first bin [0, 0.05] (argmax = option 0 = label)
    uniform = np.full((1, 20), 0.05)
    assert C.ece(uniform, np.array([0])) == pytest.approx(0.95)

    # confidences 0.15 and 0.1500001 (wrong both) land in different bins; 0.15 shares (0.1, 0.15] with 0.12
    def row(c):
        r = np.full(20, (1 - c) / 19)
        r[0] = c
        return r

    p = np.stack([row(0.15), row(0.12), row(0.1500001)])
    label = np.array([1, 0, 1])  # wrong, right, wrong
    bin_a = 2 / 3 * abs(0.5 - (0.15 + 0.12) / 2)
    bin_b = 1 / 3 * abs(0.0 - 0.1500001)
    assert C.ece(p, label) == pytest.approx(bin_a + bin_b)


def test_ece_matches_explicit_bin_loop(rng):
    p = _rand_probs(rng, 500, 3)
    label = rng.integers(0, 3, 500)
    conf, correct = p.max(-1), p.argmax(-1) == label
    total = 0.0
    for b in range(20):
        lo, hi = b / 20, (b + 1) / 20
        sel = (conf >= lo) & (conf <= hi) if b == 0 else (conf > lo) & (conf <= hi)
        if sel.any():
            total += sel.mean() * abs(correct[sel].mean() - conf[sel].mean())
    assert C.ece(p, label) == pytest.approx(total)


def test_ece_debiased_hand_case_and_kumar_monte_carlo():
    """Bin (0.85, 0.9]: confidences .9 .9 .9 .9, right twice -> gap -.4, sd sqrt(.25 / 4) = .25; bin
    (0.65, 0.7]: one right answer -> acc 1, sd 0, no correction. Debiased term 2|g| - E|N(g, sd^2)|."""
    p = np.array([[0.9, 0.1]] * 4 + [[0.3, 0.7]])
    label = np.array([0, 0, 1, 1, 1])
    g, sd = -0.4, 0.25
    phi = 0.5 * (1 + math.erf((-g / sd) / math.sqrt(2)))  # P(N(0,1) < -g / sd)
    folded = sd * math.sqrt(2 / math.pi) * math.exp(-0.5 * (g / sd) ** 2) + g * (1 - 2 * phi)
    expected = 4 / 5 * (2 * 0.4 - folded) + 1 / 5 * 0.3
    assert C.ece_debiased(p, label) == pytest.approx(expected, abs=1e-12)
    assert C.ece_debiased(p, label) < C.ece(p, label)  # the plug-in runs high
    # Kumar et al.'s own form: 2 x plug-in - mean plug-in over normal draws of each bin's accuracy
    draws = np.random.default_rng(0).normal([0.5, 1.0], [sd, 0.0], size=(400_000, 2))
    mc = 2 * C.ece(p, label) - (np.abs(draws - [0.9, 0.7]) @ [4 / 5, 1 / 5]).mean()
    assert C.ece_debiased(p, label) == pytest.approx(mc, abs=2e-3)


def test_ece_debiased_is_clipped_at_zero_and_registered():
    p = np.array([[0.55, 0.45]] * 30)  # 17 of 30 right at confidence .55: gap .017, well inside its sd .09
    label = np.array([0] * 17 + [1] * 13)
    assert C.ece_debiased(p, label) == 0.0 < C.ece(p, label)
    assert (
        M.METRICS["ece"].compute(M.EvalArrays(p, p[:, None], np.ones((20, 1)), label, np.eye(2)[label]))
        == 0.0
    )


def test_nll_and_brier_hand_cases():
    p = np.array([[0.8, 0.2], [0.4, 0.6]])
    label = np.array([0, 0])
    assert M.nll_terms(p, label).mean() == pytest.approx(-(np.log(0.8 + 1e-10) + np.log(0.4 + 1e-10)) / 2)
    assert M.nll_terms(np.array([[1.0, 0.0]]), np.array([1])).mean() == pytest.approx(-np.log(1e-10))
    onehot = np.eye(2)[label]
    assert M.brier(p, onehot).tolist() == pytest.approx([0.08, 0.72])
    # soft target: expected Brier 1 + sum p^2 - 2 <p, q>
    q = np.array([0.7, 0.3])
    assert M.brier(p[0], q) == pytest.approx(1 + 0.68 - 2 * (0.56 + 0.06))
    assert M.per_agent_brier(p[None], onehot[:1])[0].tolist() == pytest.approx([0.08, 0.72])


def test_mrr_ties_stable_descending_and_lowest_best_index():
    # weights tie between agents 0 and 1; best agent is 1 -> agent 0 comes first -> rank 2
    assert M.mrr_terms(np.array([[0.5, 0.5, 0.0]]), np.array([[0.2, 0.1, 0.3]])).mean() == 0.5
    # Brier tie between agents 0 and 1 -> best is 0; two agents have larger weight -> rank 3
    rr = M.mrr_terms(np.array([[0.2, 0.5, 0.3]]), np.array([[0.1, 0.1, 0.3]]))  # [N]
    assert rr.tolist() == pytest.approx([1 / 3])
    # uniform weights: 1 / (best index + 1)
    b = np.array([[0.3, 0.1, 0.2], [0.1, 0.2, 0.3], [0.3, 0.2, 0.1]])
    assert M.mrr_terms(np.full((3, 3), 1 / 3), b).mean() == pytest.approx((1 / 2 + 1 + 1 / 3) / 3)


def test_mrr_matches_stable_argsort(rng):
    w = rng.integers(0, 3, (200, 5)).astype(float)  # many ties
    b = rng.integers(0, 3, (200, 5)).astype(float)
    ranks = []
    for wi, bi in zip(w, b, strict=True):
        order = np.argsort(-wi, kind="stable")
        ranks.append(1 / (1 + np.flatnonzero(order == np.argmin(bi))[0]))
    assert M.mrr_terms(w, b).mean() == pytest.approx(np.mean(ranks))


def test_kendall_tau_matches_scipy_without_ties(rng):
    w = rng.random((50, 5))
    b = rng.random((50, 5))
    expected = np.mean([stats.kendalltau(wi, -bi).statistic for wi, bi in zip(w, b, strict=True)])
    assert M.kendall_tau_terms(w, b).mean() == pytest.approx(expected)


def test_kendall_tau_a_with_ties_differs_from_tau_b():
    w = np.array([[0.5, 0.5, 0.0]])
    b = np.array([[0.1, 0.2, 0.3]])  # -Brier order 0 > 1 > 2
    # pairs: (0,1) weight tie -> 0; (0,2) concordant; (1,2) concordant -> 2/3 (tau-a)
    assert M.kendall_tau_terms(w, b).mean() == pytest.approx(2 / 3)
    assert stats.kendalltau(w[0], -b[0]).statistic == pytest.approx(2 / np.sqrt(6))  # tau-b would differ
    assert M.kendall_tau_terms(np.full((4, 3), 1 / 3), np.random.default_rng(0).random((4, 3))).mean() == 0.0
    # larger weight, lower Brier
    assert M.kendall_tau_terms(np.array([[0.1, 0.9]]), np.array([[0.2, 0.1]])).mean() == 1.0
    assert np.isnan(M.kendall_tau_terms(np.ones((3, 1)), np.ones((3, 1))).mean())


def test_dynamic_regret_hand_case_and_registry_agrees(rng):
    probs = np.array([[[0.8, 0.2], [0.4, 0.6]]])  # Brier 0.08 and 0.72
    agg = np.array([[0.6, 0.4]])  # Brier 0.32
    target = np.array([[1.0, 0.0]])
    regret = M.regret_terms(M.brier(agg, target), M.per_agent_brier(probs, target))  # [N]
    assert regret.tolist() == pytest.approx([0.24])
    p = _rand_probs(rng, 40, 3, 4)
    w = rng.dirichlet(np.ones(3), 40)
    agg = np.einsum("nm,nmk->nk", w, p)
    label = rng.integers(0, 4, 40)
    arrays = M.EvalArrays(agg, p, w, label, np.eye(4)[label])
    assert M.compute_metrics(arrays, ["d_regret"])["d_regret"] == pytest.approx(
        M.regret_terms(M.brier(agg, np.eye(4)[label]), M.per_agent_brier(p, np.eye(4)[label])).mean()
    )


def test_bernoulli_kld_tvd_vs_scipy():
    pred = np.array([0.7, 0.2, 0.5, 1.0])
    target = np.array([0.6, 0.0, 0.5, 0.9])
    clip = lambda x: np.clip(x, 1e-10, 1 - 1e-10)  # noqa: E731
    expected = np.mean(
        [stats.entropy([t, 1 - t], [p, 1 - p]) for p, t in zip(clip(pred), clip(target), strict=True)]
    )
    assert M.bernoulli_kld_terms(pred, target).mean() == pytest.approx(expected)
    assert M.bernoulli_tvd_terms(pred, target).mean() == pytest.approx((0.1 + 0.2 + 0 + 0.1) / 4)


def test_kld_tvd_registry_binary_only():
    p = np.array([[0.7, 0.3]])
    arrays = M.EvalArrays(p, p[:, None, :], np.ones((1, 1)), np.array([0]), np.array([[0.6, 0.4]]))
    out = M.compute_metrics(arrays, ["kld", "tvd"])
    assert out["tvd"] == pytest.approx(0.1)
    assert out["kld"] == pytest.approx(stats.entropy([0.6, 0.4], [0.7, 0.3]))
    p3 = np.array([[0.5, 0.3, 0.2]])
    a3 = M.EvalArrays(p3, p3[:, None, :], np.ones((1, 1)), np.array([0]), np.eye(3)[[0]])
    assert np.isnan(M.compute_metrics(a3, ["kld"])["kld"])


def test_inverse_hhi():
    assert M.inverse_hhi_terms(np.full((3, 4), 0.25)).mean() == pytest.approx(4.0)
    assert M.inverse_hhi_terms(np.eye(3)).mean() == pytest.approx(1.0)
    assert M.inverse_hhi_terms(np.array([[0.5, 0.25, 0.25]])).mean() == pytest.approx(1 / 0.375)


def test_hard_subset_drops_questions_every_agent_gets_right():
    probs = np.array(
        [
            [[0.9, 0.1], [0.6, 0.4]],  # both right
            [[0.2, 0.8], [0.7, 0.3]],  # agent 0 wrong
            [[0.4, 0.6], [0.3, 0.7]],  # both wrong
        ]
    )
    assert M.hard_subset(probs, np.array([0, 0, 0])).tolist() == [False, True, True]


def test_mean_per_agent():
    assert M.mean_per_agent(np.array([[0.1, 0.3], [0.3, 0.5]])).tolist() == pytest.approx([0.2, 0.4])


def test_registry_metadata_is_complete():
    for name in M.MAIN_COLUMNS["hard"] + M.MAIN_COLUMNS["soft"]:
        info = M.METRICS[name]
        assert info.scale == 100.0 and info.higher_is_better is not None
    assert M.METRICS["ece"].higher_is_better is False and M.METRICS["auc"].higher_is_better is True
    assert {"hard"} <= M.METRICS["mrr"].applies and {"soft"} <= M.METRICS["kld"].applies
    assert M.METRICS["inverse_hhi"].scale == 1.0
