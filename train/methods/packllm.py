"""PackLLM baseline: weight each agent by the inverse perplexity of its OWN prompt (SPEC §6).

weights = softmax_i(-log(ppl_i) / tau) = softmax_i(-prompt_nll_i / tau), tau = 1, i.e. w_i proportional
to 1 / ppl_i. ppl is clipped at 1e-12 as in the reference (log ppl >= log 1e-12).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from walla.manifests.validate import build, check, config, to_dict
from walla.train.method_io import as_rows, pooled_output
from walla.train.methods import LogFn, MethodOutput

PPL_CLIP = 1e-12


@config
class Config:
    tau: float = 1.0  # softmax temperature over -log perplexity (reference: 1)

    def __post_init__(self) -> None:
        check(self.tau > 0, "tau", "> 0", self.tau)


def fit(data, cfg: Config, seeds: Sequence[int], env, logs: Sequence[LogFn | None]) -> list[dict]:
    """Nothing to learn; checks that prompt NLLs are usable. One state per seed."""
    nll = np.asarray(data.prompt_nll)
    if nll.shape != (len(data.split), data.n_agents):
        raise ValueError(
            f"scenario {data.name!r}: prompt_nll has shape {nll.shape}, "
            f"expected [{len(data.split)}, {data.n_agents}]"
        )
    return [{"config": to_dict(cfg)} for _ in seeds]


def predict(state: dict, data, rows: np.ndarray, env) -> MethodOutput:
    c = build(Config, state["config"], "packllm state")
    rows = as_rows(rows, len(data.split))
    nll = torch.from_numpy(np.asarray(data.prompt_nll[rows], dtype=np.float64))  # [n, M] prompt NLL, host
    if not torch.isfinite(nll).all():
        bad = np.argwhere(~np.isfinite(nll.numpy()))[0]
        raise ValueError(
            f"scenario {data.name!r}: prompt_nll is not finite at question "
            f"{data.question_id[rows[bad[0]]]!r}, agent slot {bad[1]}"
        )
    log_ppl = nll.clamp_min(math.log(PPL_CLIP))  # [n, M]
    weights = torch.softmax(-log_ppl / c.tau, dim=-1)  # [n, M], proportional to 1/ppl at tau = 1
    return pooled_output(data, rows, weights)
