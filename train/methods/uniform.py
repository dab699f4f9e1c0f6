"""UniformAvg baseline: every agent gets weight 1/M; the aggregate is the plain linear pool (SPEC §6)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from walla.manifests.validate import config, to_dict
from walla.train.method_io import as_rows, pooled_output
from walla.train.methods import LogFn, MethodOutput


@config
class Config:
    """No hyper-parameters: equal weights."""


def fit(data, cfg: Config, seeds: Sequence[int], env, logs: Sequence[LogFn | None]) -> list[dict]:
    """Nothing to learn: one state per seed holding the config."""
    return [{"config": to_dict(cfg)} for _ in seeds]


def predict(state: dict, data, rows: np.ndarray, env) -> MethodOutput:
    """w_i = 1/M for every question in ``rows``."""
    rows = as_rows(rows, len(data.split))
    # host-side like every learning-free method: its result cannot depend on --device (its run key has none)
    weights = torch.full((len(rows), data.n_agents), 1.0 / data.n_agents, device="cpu")  # [n, M]
    return pooled_output(data, rows, weights)
