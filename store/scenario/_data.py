"""ScenarioData: the assembled arrays of one scenario -- the only input of training and evaluation.

data = assemble_scenario(scenario, Path("walla-store"))  # store/scenario/_assemble.py
test = data.split_index("test")
small = data.limit_rows(200)                            # quick looks: every split keeps its share
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np


@dataclass
class ScenarioData:
    """All arrays of one scenario, aligned on the question axis N.

    N questions (all splits; `split` says which), M agent slots, K = max option count.
    Questions with fewer options than K have zero probability and option_mask False there.
    """

    name: str
    dataset: str  # dataset of the rows (for OOD scenarios: "mmlu+arc-challenge")
    agents: list[str]  # model short name per slot, len M
    question_id: np.ndarray  # [N] str
    split: np.ndarray  # [N] str in {"train","val","test"}
    question: list[str]  # [N] question text (routers without context)
    prompts: list[list[str]] | None  # [M][N] each agent's own prompt text (routers with context), optional
    n_options: np.ndarray  # [N] int
    option_mask: np.ndarray  # [N, K] bool
    probs: np.ndarray  # [N, M, K] float32, each agent's option distribution (rows sum to 1)
    label: np.ndarray  # [N] int64, 0-based correct option
    target: np.ndarray  # [N, K] float32: gold_dist if soft else one-hot(label)
    soft_target: bool  # True for BayesX-like datasets (KL/TVD metrics, KL early stopping)
    prompt_nll: np.ndarray  # [N, M] float32 mean prompt NLL of each agent's own prompt
    variant: np.ndarray  # [N, M] int8 codes of schema.VARIANTS (context routing record)
    hidden: list[np.ndarray]  # [M] arrays [N, H_i] (float16/float32; may be memory-mapped)
    fingerprints: dict[str, str] = field(default_factory=dict)  # "<model>/<variant>" -> feature-set fp
    meta: dict = field(default_factory=dict)  # resolved manifest, context-assignment seed, etc.

    @property
    def n_agents(self) -> int:
        return len(self.agents)

    def split_index(self, split: str) -> np.ndarray:
        """Row indices of one split, in stored order."""
        return np.flatnonzero(self.split == split)

    def subset(self, rows: np.ndarray) -> ScenarioData:
        """The same scenario restricted to `rows` (in the given order)."""
        rows = np.asarray(rows, dtype=np.int64)
        return dataclasses.replace(
            self,
            question_id=self.question_id[rows],
            split=self.split[rows],
            question=[self.question[i] for i in rows],
            prompts=None if self.prompts is None else [[p[i] for i in rows] for p in self.prompts],
            n_options=self.n_options[rows],
            option_mask=self.option_mask[rows],
            probs=self.probs[rows],
            label=self.label[rows],
            target=self.target[rows],
            prompt_nll=self.prompt_nll[rows],
            variant=self.variant[rows],
            hidden=[np.asarray(h[rows]) for h in self.hidden],
            meta={**self.meta, "limit_rows": int(len(rows))},
        )

    def limit_rows(self, n: int) -> ScenarioData:
        """Keep about n rows, every split keeping its share (at least one row each), in stored order.

        The result is named "<scenario>-rows<n>" so its runs never mix with (or skip) full-scenario runs.
        """
        if n >= len(self.split):
            return self
        keep = []
        for s in ("train", "val", "test"):
            idx = self.split_index(s)
            if len(idx):
                keep.append(idx[: max(1, math.floor(n * len(idx) / len(self.split)))])
        return dataclasses.replace(self.subset(np.sort(np.concatenate(keep))), name=f"{self.name}-rows{n}")
