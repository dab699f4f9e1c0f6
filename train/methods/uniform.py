"""UniformAvg baseline: every agent gets weight 1/M; the aggregate is the plain linear pool (SPEC §6)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from walla.train.methods import LogFn, MethodOutput
from walla.train.methods._baselines import as_rows, build_config, pooled_output, resolved_dict

NAME = "uniform"


@dataclass(frozen=True)
class UniformConfig:
    """No hyper-parameters: equal weights."""


def resolve(data, cfg: dict | None) -> dict:
    """The fully resolved config (defaults filled in) that run.json records."""
    return resolved_dict(UniformConfig, cfg, NAME)


def fit(data, cfg: dict, seed: int, log: LogFn | None = None) -> dict:
    """Nothing to learn; validates cfg (no keys allowed) and returns it."""
    return {"config": build_config(UniformConfig, cfg, NAME)}


def predict(state: dict, data, rows: np.ndarray) -> MethodOutput:
    """w_i = 1/M for every question in ``rows``."""
    rows = as_rows(rows, len(data.split))
    weights = torch.full((len(rows), data.n_agents), 1.0 / data.n_agents)  # [n, M]
    return pooled_output(data, rows, weights)
