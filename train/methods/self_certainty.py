"""SelfCertainty baseline: weight agents by their confidence KL(U || p_i), softmaxed across agents.

SPEC §6 / §10.8: p_i clipped at 1e-12 over the question's real options, c_i = KL(U || p_i)
= -log K_q - (1/K_q) sum_k log p_ik, c_i = max(c_i, 0) + 1e-8, weights = softmax_i(c_i / temperature)
(a softmax across agents, not a proportional normalization -- the reference's actual behaviour).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from walla.train.methods import LogFn, MethodOutput
from walla.train.methods._baselines import as_rows, build_config, pooled_output, resolved_dict

NAME = "self-certainty"
PROB_CLIP = 1e-12
CONF_OFFSET = 1e-8


@dataclass(frozen=True)
class SelfCertaintyConfig:
    temperature: float = 1.0  # softmax temperature across agents (reference: 1)

    def check(self, method: str) -> None:
        if not self.temperature > 0:
            raise ValueError(f"{method}: config key 'temperature' must be > 0, got {self.temperature!r}")


def confidence(probs: torch.Tensor, option_mask: torch.Tensor) -> torch.Tensor:
    """KL(U || p_i) over each question's real options: probs [n, M, K], option_mask [n, K] -> [n, M]."""
    m = option_mask.to(probs.dtype).unsqueeze(-2)  # [n, 1, K]
    k_q = m.sum(-1)  # [n, 1] real option count
    logp = torch.log(probs.clamp_min(PROB_CLIP)) * m  # [n, M, K], absent options contribute 0
    return -torch.log(k_q) - logp.sum(-1) / k_q  # [n, M]


def resolve(data, cfg: dict | None) -> dict:
    """The fully resolved config (defaults filled in) that run.json records."""
    return resolved_dict(SelfCertaintyConfig, cfg, NAME)


def fit(data, cfg: dict, seed: int, log: LogFn | None = None) -> dict:
    """Nothing to learn; validates cfg."""
    return {"config": build_config(SelfCertaintyConfig, cfg, NAME)}


def predict(state: dict, data, rows: np.ndarray) -> MethodOutput:
    c = state["config"]
    rows = as_rows(rows, len(data.split))
    probs = torch.as_tensor(np.asarray(data.probs[rows], dtype=np.float64))  # [n, M, K]
    mask = torch.as_tensor(np.asarray(data.option_mask[rows], dtype=bool))  # [n, K]
    conf = confidence(probs, mask).clamp_min(0.0) + CONF_OFFSET  # [n, M]
    weights = torch.softmax(conf / c.temperature, dim=-1)  # [n, M]
    return pooled_output(data, rows, weights, extras={"confidence": conf.numpy().astype(np.float32)})
