"""Private-context routing: which agent slot sees which prompt variant for each question (SPEC §3.3).

Rules (a scenario's `context_rule`):
    none                          every slot gets `none`
    one_relevant                  per question one slot gets `relevant` (its own context), the rest `none`
    one_relevant_one_irrelevant   additionally one OTHER slot gets `irrelevant` (another question's context)

Assignments are drawn per split from numpy's default_rng([context_seed, split index]): independent per
split, reproducible, and the same for every training seed. Both the relevant and the irrelevant slot
are balanced: over a split of n questions each slot holds each role floor(n/M) or ceil(n/M) times,
and which slots get the remainder is random.
"""

from __future__ import annotations

import numpy as np
from walla.store.schema import SPLITS, VARIANT_CODE

CONTEXT_RULES = ("none", "one_relevant", "one_relevant_one_irrelevant")


def variants_needed(rule: str, n_agents: int) -> tuple[str, ...]:
    """Prompt variants a rule can hand to a model (what must be extracted for it)."""
    if rule == "none":
        return ("none",)
    if rule == "one_relevant":
        return ("none", "relevant") if n_agents > 1 else ("relevant",)
    if rule == "one_relevant_one_irrelevant":
        if n_agents < 2:
            raise ValueError("context_rule one_relevant_one_irrelevant needs at least 2 agents")
        return ("none", "relevant", "irrelevant") if n_agents > 2 else ("relevant", "irrelevant")
    raise ValueError(f"context_rule must be one of {CONTEXT_RULES}, got {rule!r}")


def assign_split(n: int, n_agents: int, rule: str, rng: np.random.Generator) -> np.ndarray:
    """Variant codes [n, M] int8 for the n questions of one split.

    Question at shuffled position t gets relevant slot sigma[t mod M] and irrelevant slot
    sigma[(t + 1 + floor(t / M) mod (M - 1)) mod M]: within each block of M positions both roles visit
    every slot once (balance), and the offset 1..M-1 keeps the two roles on different slots.
    """
    variants_needed(rule, n_agents)  # validates the rule
    out = np.full((n, n_agents), VARIANT_CODE["none"], dtype=np.int8)  # [n, M]
    if rule == "none" or n == 0:
        return out
    m = n_agents
    perm = rng.permutation(n)  # question at shuffled position t is perm[t]
    sigma = rng.permutation(m)  # slot order: the first n mod M slots get one extra question
    t = np.arange(n)
    rows = np.arange(n)
    rel = np.empty(n, dtype=np.int64)
    rel[perm] = sigma[t % m]
    out[rows, rel] = VARIANT_CODE["relevant"]
    if rule == "one_relevant_one_irrelevant":
        irr = np.empty(n, dtype=np.int64)
        irr[perm] = sigma[(t + 1 + (t // m) % (m - 1)) % m]
        assert not np.any(irr == rel)
        out[rows, irr] = VARIANT_CODE["irrelevant"]
    return out


def assign(split: np.ndarray, n_agents: int, rule: str, seed: int) -> np.ndarray:
    """Variant codes [N, M] int8 for questions labelled with `split` [N] (each split drawn independently)."""
    out = np.full((len(split), n_agents), VARIANT_CODE["none"], dtype=np.int8)  # [N, M]
    for i, s in enumerate(SPLITS):
        idx = np.flatnonzero(split == s)
        out[idx] = assign_split(idx.size, n_agents, rule, np.random.default_rng([seed, i]))
    return out


def assignment_counts(split: np.ndarray, variant: np.ndarray) -> dict[str, dict[str, list[int]]]:
    """{split: {variant: per-slot question counts}} -- recorded in ScenarioData.meta."""
    out = {}
    for s in SPLITS:
        rows = variant[split == s]  # [n_s, M]
        out[s] = {v: (rows == c).sum(axis=0).astype(int).tolist() for v, c in VARIANT_CODE.items()}
    return out
