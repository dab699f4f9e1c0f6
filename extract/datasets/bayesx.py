"""BayesX "cluster saturation": a generated Bayesian-update dataset with a soft ground truth (SPEC §1.4).

Per row (Python `random.Random(seed)`, default seed 42, 10,000 rows): with probability 1/2 the
prior is P(S=1) = 0.1 and the warning signal is W = 1, else the prior is 0.9 and W = 0; the
monitor's TPR ~ U(0.90, 0.95) and FPR ~ U(0.05, 0.10), both rounded to 2 decimals. The
posterior P(S=1 | W) (rounded to 8 decimals) is the ground truth: gold_dist = [posterior,
1 - posterior] over the options ['1', '0'] ('1' = option 0: our fix of SPEC §10.7), label = 0 iff
posterior > 0.5. The evidence always flips the prior's answer toward uncertainty, so the agent
that sees it (the `relevant` variant) should be less confident, and right.

Question text = the scenario and the prior (what every agent sees); context = the update rule
and the evidence (what only the informed agent sees). The prompts are in extract/prompts.py.
"""

from __future__ import annotations

import random

from walla.extract.datasets.rows import DatasetRequest, Loaded, canonical_row, generated

DEFAULTS = {"n": 10_000, "seed": 42, "tpr_range": (0.90, 0.95), "fpr_range": (0.05, 0.10)}


def question_text(prior: float) -> str:
    return (
        "A load balancer distributes incoming requests across a compute cluster. The cluster is in one of two "
        "states: S=1 if it will saturate in the next hour, S=0 if it will not. From historical load data, the "
        f"prior probability that the cluster will saturate is P(S=1)= {prior:.2f}."
    )


def context_text(tpr: float, fpr: float, w: int) -> str:
    return (
        "Update Rule:A monitoring agent watches the cluster and raises a warning signal W. Its true positive rate "
        f"is P(W=1|S=1)= {tpr:.2f} and its false positive rate is P(W=1|S=0)= {fpr:.2f}. Combine the prior with "
        "the evidence using Bayes' rule.\n"
        f"Evidence:The monitoring agent outputs $W=$ {w}."
    )


def posterior(prior: float, tpr: float, fpr: float, w: int) -> float:
    """P(S=1 | W=w) by Bayes' rule."""
    like1, like0 = (tpr, fpr) if w == 1 else (1 - tpr, 1 - fpr)
    return prior * like1 / (prior * like1 + (1 - prior) * like0)


def generate(n: int = 10_000, seed: int = 42, tpr_range=(0.90, 0.95), fpr_range=(0.05, 0.10)) -> list[dict]:
    """n canonical rows (see module docstring); deterministic in (n, seed, ranges)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        prior, w = (0.1, 1) if rng.random() < 0.5 else (0.9, 0)
        tpr = round(rng.uniform(*tpr_range), 2)
        fpr = round(rng.uniform(*fpr_range), 2)
        post = round(posterior(prior, tpr, fpr, w), 8)
        rows.append(
            canonical_row(
                f"bayesx-{i:05d}",
                question_text(prior),
                ["1", "0"],
                0 if post > 0.5 else 1,
                option_labels=["1", "0"],
                context=context_text(tpr, fpr, w),
                gold_dist=[post, round(1 - post, 8)],
            )
        )
    return rows


def load(req: DatasetRequest) -> Loaded:
    """Loader entry point: generator parameters from the manifest's `generator:` block."""
    return generated(
        req, DEFAULTS, 1, lambda n, seed, p: generate(n, seed, tuple(p["tpr_range"]), tuple(p["fpr_range"]))
    )
