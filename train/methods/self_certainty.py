"""SelfCertainty baseline: weight agents by their confidence KL(U || p_i), softmaxed across agents.

SPEC §6 / §10.8: p_i clipped at 1e-12 over the question's real options, c_i = KL(U || p_i)
= -log K_q - (1/K_q) sum_k log p_ik, c_i = max(c_i, 0) + 1e-8, weights = softmax_i(c_i / temperature)
(a softmax across agents, not a proportional normalization -- the reference's actual behaviour).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from walla.manifests.validate import build, check, config, to_dict
from walla.train.method_io import as_rows, pooled_output
from walla.train.methods import LogFn, MethodOutput

PROB_CLIP = 1e-12
CONF_OFFSET = 1e-8


@config
class Config:
    temperature: float = 1.0  # softmax temperature across agents (reference: 1)

    def __post_init__(self) -> None:
        check(self.temperature > 0, "temperature", "> 0", self.temperature)


def confidence(probs: torch.Tensor, option_mask: torch.Tensor) -> torch.Tensor:
    """KL(U || p_i) over each question's real options: probs [n, M, K], option_mask [n, K] -> [n, M]."""
    m = option_mask.to(probs.dtype).unsqueeze(-2)  # [n, 1, K]
    k_q = m.sum(-1)  # [n, 1] real option count
    logp = torch.log(probs.clamp_min(PROB_CLIP)) * m  # [n, M, K], absent options contribute 0
    return -torch.log(k_q) - logp.sum(-1) / k_q  # [n, M]


def fit(data, cfg: Config, seeds: Sequence[int], env, logs: Sequence[LogFn | None]) -> list[dict]:
    """Nothing to learn: one state per seed holding the config."""
    return [{"config": to_dict(cfg)} for _ in seeds]


def predict(state: dict, data, rows: np.ndarray, env) -> MethodOutput:
    c = build(Config, state["config"], "self-certainty state")
    rows = as_rows(rows, len(data.split))
    # host tensors (from_numpy), as every learning-free method: its result cannot depend on --device
    probs = torch.from_numpy(np.asarray(data.probs[rows], dtype=np.float64))  # [n, M, K]
    mask = torch.from_numpy(np.asarray(data.option_mask[rows], dtype=bool))  # [n, K]
    conf = confidence(probs, mask).clamp_min(0.0) + CONF_OFFSET  # [n, M]
    weights = torch.softmax(conf / c.temperature, dim=-1)  # [n, M]
    return pooled_output(data, rows, weights, extras={"confidence": conf.numpy().astype(np.float32)})
