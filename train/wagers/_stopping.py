"""Online early stopping of WALLA's batched heads, one stopping state per seed (SPEC §4.2).

    stop = OnlineStop(cfg, heads, n_seeds, heads_per_seed, logs)
    ... every training batch, AFTER the forward pass and BEFORE the optimizer step:
        done = stop.update(step, epoch, b, summary, payout)   # pre-update metrics of this batch
        <backward, clip, optimizer step>
        if done: break
    best = stop.best_or_last(last_params)

Per seed s the batch metric (D-regret or KL of the pre-update aggregate, mean over the batch) enters a
ring of the last W batches; once W batches were seen, the size-weighted window mean is compared with the
best so far: a strict improvement makes the state AFTER this batch's update seed s's best state and resets
the patience counter; otherwise the counter grows, and the seed stops when it reaches `patience` batches.
A stopped seed keeps computing in the batched module (cheaper than re-packing) but its best state is frozen
and its log ends.

The best state is kept lazily, on the parameters' device: an improvement only marks seed s "pending" (its
best state is whatever the parameters are after the coming update). The next batch either improves again
(the pending state is superseded, nothing is copied) or not, and then seed s's rows are copied into the
best copy BEFORE that batch's update changes them -- the very state the eager copy would have taken. A
pending seed at the end takes the last state. Early in training almost every batch improves; copying every
time moved ~2 bytes per parameter per step through memory (0.55 GB of reads and writes per step at the
paper's width).
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
        self.best: list[torch.Tensor] | None = None  # allocated on the first copy
        self.pending = [False] * n_seeds  # best state = the parameters after the coming update
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

    def _copy_rows(self, s: int) -> None:
        """Copy seed s's rows of every parameter (its current state) into the best copy."""
        params = list(self.heads.parameters())
        if self.best is None:
            self.best = [torch.empty_like(p, device=p.device) for p in params]
        rows = slice(s * self.a_n, (s + 1) * self.a_n)
        with torch.no_grad():
            for bp, p in zip(self.best, params, strict=True):
                bp[rows] = p.detach()[rows]

    def update(self, step: int, epoch: int, b: int, summary: dict, payout: torch.Tensor) -> bool:
        """Account for one batch, called BEFORE its optimizer step (module docstring).

        `summary`: per-seed CPU tensors "mse" [S, M], "metric" [S] (absent: no stopping metric),
        "wager" [S, M], "adv" [S, M]. Returns True once every seed has stopped: the caller trains one
        more update, this batch's, then ends.
        """
        self.n_seen += b
        wms = self._window(step, b, summary.get("metric")).tolist()  # host floats: no tensor op per seed
        for s, wm in enumerate(wms):
            if not self.active[s]:
                continue
            improved = not math.isnan(wm) and wm < self.best_val[s]
            if self.pending[s] and not improved:  # the parameters still hold the pending best state
                self._copy_rows(s)
            self.pending[s] = improved
            if improved:
                self.best_val[s], self.bad[s], self.best_step[s] = wm, 0, step
            elif not math.isnan(wm):
                self.bad[s] += 1
            self._log(s, step, epoch, summary, payout, wm)
            if self.bad[s] >= self.cfg.patience:
                self.active[s], self.stop_step[s] = False, step
        return self.done

    def _log(self, s: int, step: int, epoch: int, summary: dict, payout: torch.Tensor, wm: float) -> None:
        if self.logs[s] is None:
            return
        metric = summary.get("metric")
        wager, adv = summary["wager"][s], summary["adv"][s]
        entry = {
            "step": step,
            "epoch": epoch,
            "n_seen": self.n_seen,
            "loss": float(summary["mse"][s].mean()),
            "stop_metric": float(metric[s]) if metric is not None else math.nan,
            "window_metric": wm,
            "wager_mean": float(wager.mean()),
            "advantage_mean": float(adv.mean()),
            "payout_mean": float(payout[s].mean()),
        }
        entry.update({f"wager_{i}": v for i, v in enumerate(wager.tolist())})
        entry.update({f"advantage_{i}": v for i, v in enumerate(adv.tolist())})
        self.logs[s](entry)

    def best_or_last(self, last: list[torch.Tensor]) -> list[torch.Tensor]:
        """The best state per seed, on the device the parameters trained on (no host round trip).

        A seed that is pending or whose window never improved takes its `last` state (the parameters
        after the final update). Returns `last` itself (no copy) when every seed does, else the best copy
        with those seeds' rows filled in from `last`.
        """
        kept = [s for s in range(self.s_n) if self.best_step[s] is not None and not self.pending[s]]
        if not kept:
            return last
        with torch.no_grad():
            for s in set(range(self.s_n)) - set(kept):
                rows = slice(s * self.a_n, (s + 1) * self.a_n)
                for bp, t in zip(self.best, last, strict=True):
                    bp[rows] = t.detach()[rows]
        return self.best
