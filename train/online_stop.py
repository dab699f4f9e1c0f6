"""Online early stopping of WALLA's batched heads, one stopping state per seed (SPEC §4.2).

    stop = OnlineStop(cfg, heads, n_seeds, heads_per_seed, logs)
    ... after every training batch:  if stop.update(step, epoch, b, summary, payout): break
    best = stop.best_or_last(last_params)

Per seed s the batch metric (D-regret or KL of the pre-update aggregate, mean over the batch) enters a
ring of the last W batches; once W batches were seen, the size-weighted window mean is compared with the
best so far: a strict improvement copies seed s's rows of every stacked parameter (the state AFTER this
batch's update) into the in-memory best copy (on the training device) and resets the patience counter; otherwise the counter
grows, and the seed stops when it reaches `patience` batches. A stopped seed keeps computing in the
batched module (cheaper than re-packing) but its best state is frozen and its log ends.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn


class OnlineStop:
    """Window bookkeeping, best-state copies and per-seed training logs of train_heads."""

    def __init__(self, cfg, heads: nn.Module, n_seeds: int, per_seed: int, logs: Sequence | None) -> None:
        self.cfg, self.heads, self.s_n, self.a_n = cfg, heads, n_seeds, per_seed
        win = int(cfg.window)
        self.ring = torch.zeros(win, n_seeds, dtype=torch.float64, device="cpu")  # batch metric * batch size
        self.ring_n = torch.zeros(win, dtype=torch.float64, device="cpu")
        self.filled, self.n_seen = 0, 0
        self.best_val = [math.inf] * n_seeds
        self.bad = [0] * n_seeds
        self.active = [True] * n_seeds
        self.best = [p.detach().clone() for p in heads.parameters()]
        self.best_step: list[int | None] = [None] * n_seeds
        self.stop_step: list[int | None] = [None] * n_seeds
        self.logs = list(logs) if logs is not None else [None] * n_seeds

    @property
    def done(self) -> bool:
        return not any(self.active)

    def _window(self, step: int, b: int, metric: torch.Tensor | None) -> torch.Tensor:
        """Push this batch's metric [S]; the size-weighted window mean [S] (NaN until the window is full)."""
        wm = torch.full((self.s_n,), math.nan, dtype=torch.float64, device="cpu")
        if metric is None:
            return wm
        win = self.ring.shape[0]
        self.ring[(step - 1) % win] = metric.double() * b
        self.ring_n[(step - 1) % win] = b
        self.filled = min(self.filled + 1, win)
        return self.ring.sum(0) / self.ring_n.sum() if self.filled == win else wm

    def update(self, step: int, epoch: int, b: int, summary: dict, payout: torch.Tensor) -> bool:
        """Account for one batch; True once every seed has stopped. `summary`: per-seed CPU tensors
        "mse" [S, M], "metric" [S] (absent: no stopping metric), "wager" [S, M], "adv" [S, M]."""
        self.n_seen += b
        metric = summary.get("metric")
        wm = self._window(step, b, metric)
        for s in range(self.s_n):
            if not self.active[s]:
                continue
            if not math.isnan(float(wm[s])):
                if float(wm[s]) < self.best_val[s]:
                    self.best_val[s], self.bad[s], self.best_step[s] = float(wm[s]), 0, step
                    rows = slice(s * self.a_n, (s + 1) * self.a_n)
                    for bp, p in zip(self.best, self.heads.parameters(), strict=True):
                        bp[rows] = p.detach()[rows]
                else:
                    self.bad[s] += 1
            self._log(s, step, epoch, summary, payout, float(wm[s]))
            if self.bad[s] >= self.cfg.patience:
                self.active[s], self.stop_step[s] = False, step
        return self.done

    def _log(self, s: int, step: int, epoch: int, summary: dict, payout: torch.Tensor, wm: float) -> None:
        if self.logs[s] is None:
            return
        metric = summary.get("metric")
        entry = {
            "step": step,
            "epoch": epoch,
            "n_seen": self.n_seen,
            "loss": float(summary["mse"][s].mean()),
            "stop_metric": float(metric[s]) if metric is not None else math.nan,
            "window_metric": wm,
            "wager_mean": float(summary["wager"][s].mean()),
            "advantage_mean": float(summary["adv"][s].mean()),
            "payout_mean": float(payout[s].mean()),
        }
        entry.update({f"wager_{i}": float(v) for i, v in enumerate(summary["wager"][s].tolist())})
        entry.update({f"advantage_{i}": float(v) for i, v in enumerate(summary["adv"][s].tolist())})
        self.logs[s](entry)

    def best_or_last(self, last: list[torch.Tensor]) -> list[torch.Tensor]:
        """The best state per seed on the CPU; a seed whose window never improved keeps its last state."""
        best = [t.detach().cpu().clone() for t in self.best]
        for s in range(self.s_n):
            if self.best_step[s] is None:
                rows = slice(s * self.a_n, (s + 1) * self.a_n)
                for bp, lp in zip(best, last, strict=True):
                    bp[rows] = lp[rows]
        return best
