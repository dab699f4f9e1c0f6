"""Scenario assembly: a scenario manifest + the store -> the arrays every method consumes.

The ScenarioData fields below are the contract between the store and stages 2-3.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class ScenarioData:
    """All arrays of one scenario, aligned on the question axis N.

    N questions (all splits; `split` says which), M agent slots, K = max option count.
    Questions with fewer options than K have zero probability and option_mask False there.
    """

    name: str
    dataset: str                      # dataset of the rows (for OOD scenarios: "mmlu+arc-challenge")
    agents: list[str]                 # model short name per slot, len M
    question_id: np.ndarray           # [N] str
    split: np.ndarray                 # [N] str in {"train","val","test"}
    question: list[str]               # [N] question text (routers without context)
    prompts: list[list[str]] | None   # [M][N] each agent's own prompt text (routers with context), optional
    n_options: np.ndarray             # [N] int
    option_mask: np.ndarray           # [N, K] bool
    probs: np.ndarray                 # [N, M, K] float32, each agent's option distribution (rows sum to 1)
    label: np.ndarray                 # [N] int64, 0-based correct option
    target: np.ndarray                # [N, K] float32: gold_dist if soft else one-hot(label)
    soft_target: bool                 # True for BayesX-like datasets (KL/TVD metrics, KL early stopping)
    prompt_nll: np.ndarray            # [N, M] float32 mean prompt NLL of each agent's own prompt
    variant: np.ndarray               # [N, M] int8 codes of schema.VARIANTS (context routing record)
    hidden: list[np.ndarray]          # [M] arrays [N, H_i] (float16/float32; may be memory-mapped)
    fingerprints: dict[str, str] = field(default_factory=dict)  # "<model>/<variant>" -> feature-set fp
    meta: dict = field(default_factory=dict)  # resolved manifest, context-assignment seed, etc.

    @property
    def n_agents(self) -> int:
        return len(self.agents)

    def split_index(self, split: str) -> np.ndarray:
        """Row indices of one split, in stored order."""
        return np.flatnonzero(self.split == split)
