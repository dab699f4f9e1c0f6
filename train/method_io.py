"""Inputs and outputs shared by the weighting methods: scenario arrays as tensors, row checks, pooled output.

probs, target, mask = scenario_tensors(data, device)    # [N, M, K], [N, K], [N, K] on device
rows = as_rows(rows, len(data.split))                    # checked int64 row indices
out = pooled_output(data, rows, weights)                 # weights [n, M] -> MethodOutput (linear pool)
"""

from __future__ import annotations

import numpy as np
import torch
from walla.train.mechanism import pool
from walla.train.methods import MethodOutput


def scenario_tensors(data, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(probs [N, M, K], target [N, K], option_mask [N, K] bool) as float32 tensors on `device`."""
    probs = torch.from_numpy(np.asarray(data.probs, dtype=np.float32)).to(device)
    target = torch.from_numpy(np.asarray(data.target, dtype=np.float32)).to(device)
    mask = torch.from_numpy(np.asarray(data.option_mask, dtype=bool)).to(device)
    return probs, target, mask


def as_rows(rows: np.ndarray, n: int) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    if rows.size and (rows.min() < 0 or rows.max() >= n):
        raise ValueError(
            f"rows must index the scenario's {n} questions, got range [{rows.min()}, {rows.max()}]"
        )
    return rows


def pooled_output(data, rows: np.ndarray, weights: torch.Tensor, extras: dict | None = None) -> MethodOutput:
    """Linear pool of the agents' probs on ``rows`` with ``weights [n, M]`` -> MethodOutput (float32).

    The pool is computed where the weights live (the scenario's arrays are moved there); host arrays back.
    """
    dev = weights.device
    probs = torch.from_numpy(np.asarray(data.probs[rows], dtype=np.float32)).to(dev)  # [n, M, K]
    mask = torch.from_numpy(np.asarray(data.option_mask[rows], dtype=bool)).to(dev)  # [n, K]
    w = weights.detach().to(torch.float32)
    w = w / w.sum(-1, keepdim=True)  # [n, M] rows sum to 1
    agg = pool(probs, w, kind="linear", option_mask=mask)  # [n, K], 0 on absent options
    return MethodOutput(
        weights=w.cpu().numpy().astype(np.float32),
        agg_probs=agg.cpu().numpy().astype(np.float32),
        extras=extras or {},
    )
