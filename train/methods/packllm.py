"""PackLLM baseline: weight each agent by the inverse perplexity of its OWN prompt (SPEC §6).

weights = softmax_i(-log(ppl_i) / tau) = softmax_i(-prompt_nll_i / tau), tau = 1, i.e. w_i proportional
to 1 / ppl_i. ppl is clipped at 1e-12 as in the reference (log ppl >= log 1e-12).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from walla.train.methods import LogFn, MethodOutput
from walla.train.methods._baselines import as_rows, build_config, pooled_output, resolved_dict

NAME = "packllm"
PPL_CLIP = 1e-12


@dataclass(frozen=True)
class PackLLMConfig:
    tau: float = 1.0  # softmax temperature over -log perplexity (reference: 1)

    def check(self, method: str) -> None:
        if not self.tau > 0:
            raise ValueError(f"{method}: config key 'tau' must be > 0, got {self.tau!r}")


def resolve(data, cfg: dict | None) -> dict:
    """The fully resolved config (defaults filled in) that run.json records."""
    return resolved_dict(PackLLMConfig, cfg, NAME)


def fit(data, cfg: dict, seed: int, log: LogFn | None = None) -> dict:
    """Nothing to learn; validates cfg and that prompt NLLs are usable."""
    nll = np.asarray(data.prompt_nll)
    if nll.shape != (len(data.split), data.n_agents):
        raise ValueError(
            f"scenario {data.name!r}: prompt_nll has shape {nll.shape}, "
            f"expected [{len(data.split)}, {data.n_agents}]"
        )
    return {"config": build_config(PackLLMConfig, cfg, NAME)}


def predict(state: dict, data, rows: np.ndarray) -> MethodOutput:
    c = state["config"]
    rows = as_rows(rows, len(data.split))
    nll = torch.as_tensor(np.asarray(data.prompt_nll[rows], dtype=np.float64))  # [n, M] mean prompt NLL
    if not torch.isfinite(nll).all():
        bad = np.argwhere(~np.isfinite(nll.numpy()))[0]
        raise ValueError(
            f"scenario {data.name!r}: prompt_nll is not finite at question "
            f"{data.question_id[rows[bad[0]]]!r}, agent slot {bad[1]}"
        )
    log_ppl = nll.clamp_min(math.log(PPL_CLIP))  # [n, M]
    weights = torch.softmax(-log_ppl / c.tau, dim=-1)  # [n, M], proportional to 1/ppl at tau = 1
    return pooled_output(data, rows, weights)
