"""One agent's wager head, taken from a WALLA run (its state.pt): the agent's own slot only.

    head = AgentHead.from_run(run_dir, slot=2)           # decentralized: agent 2's parameters, nothing else
    w = head.wager(hidden)                               # eval mode, float64: = walla.predict's wager
    p = head.calibrate(probs, hidden, relevant) if head.calibrate else probs   # walla-i-cal's temperatures
    head.update([(hidden, advantage), ...])              # one training step from the agent's own payouts

Wager (exactly walla.train.methods.walla.predict for one row): x = the agent's hidden state as float32
(standardized with the agent's own train statistics when the run did), r = head(x) in eval mode,
w = sigmoid(r / T) in float64. A walla-i-cal run also calibrates the agent's probabilities first, with its own
temperature head(s) (train/calibration agent_calibrator: softmax(log p / T(x)), as walla.predict pooled them).
Update (the run's loss and optimizer settings, walla.train_heads for one
agent): w* = clip(A / 2c3, 0, 1) from the agent's OWN advantage A (the payout record carries it; equally
A = pi / w + c3 w), loss = mean (w - w*)^2 over the batch with dropout masks on
(walla.train.wagers._step.wager_loss), then walla train's own step: per-head gradient-norm clipping at the
run's `clip` and one Adam step at the run's lr (wager_step.optimizer_step through a single-device
Fabric, the optimizer from engine.make_optimizer). The Adam moments start at zero: a run's state.pt keeps
the best parameters, not its optimizer state (there is none to load yet).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from walla.train.calibration import CalibrationConfig, agent_calibrator
from walla.train.engine import TrainEnv, make_fabric, make_optimizer
from walla.train.methods import get_method
from walla.train.methods.walla import Config
from walla.train.runs import STATE, read_current_run_meta, read_scenario_meta, retrain_command, run_seed
from walla.train.wagers import StackedHeads, optimizer_step, wager_loss


class HeadError(ValueError):
    """A run that cannot give a live agent its head (names the run and what is wrong)."""


def walla_config(state: dict) -> Config:
    """The run's resolved WALLA Config, as walla.predict rebuilds it."""
    raw = state["cfg"]
    return Config(**{**raw, "calibration": CalibrationConfig(**raw["calibration"])})


class AgentHead:
    """Slot `slot`'s wager head of a trained WALLA state (see module docstring)."""

    def __init__(self, state: dict, slot: int, where: str = "state", seed: int | None = None) -> None:
        self.cfg = walla_config(state)
        dims = [int(d) for d in state["in_dims"]]
        if not 0 <= slot < len(dims):
            raise HeadError(
                f"{where}: slot {slot} out of range (the run has {len(dims)} agents: 0..{len(dims) - 1})"
            )
        self.slot, self.in_dim = slot, dims[slot]
        cal = state.get("calibration")  # walla-i-cal: the agent's fitted temperature head(s)
        self.calibrate = None if cal is None else agent_calibrator(cal, slot)
        cfg = self.cfg
        # float32 whatever torch's default dtype is now: a model loading in another thread sets it process-wide
        heads = StackedHeads([self.in_dim], cfg.hidden, cfg.dropout, cfg.projection_dim, init=False)
        self.heads = heads.float()
        rows = [
            p[slot : slot + 1].clone() for p in state["params"]
        ]  # head = kind * M + agent: kind 0 = wager
        rows[0] = rows[0][:, : self.in_dim]  # padding input rows of a heterogeneous ensemble are zero: crop
        self.heads.load_rows(slice(None), rows)
        self.heads.eval()
        stats = state.get("hidden_stats")
        self.stats = None if stats is None else (stats[0][slot, : self.in_dim], stats[1][slot, : self.in_dim])
        seed = int(state.get("seed", 0)) if seed is None else seed
        self.masks = np.random.default_rng([seed, 3, slot])  # dropout masks of live updates
        self.opt: torch.optim.Optimizer | None = None
        self.fabric = None
        self.steps = 0

    @classmethod
    def from_run(cls, run: str | Path, slot: int) -> AgentHead:
        """The head of agent `slot` in a complete, current WALLA run directory (run.json + state.pt): a
        stale run (other inputs, another walla train schema) or one moved out of its key directory is
        refused, as walla eval and joining refuse it (train/runs/_lineage.py read_current_run_meta)."""
        run = Path(run)
        meta = read_current_run_meta(run)  # RunFormatError when missing, unreadable or stale
        method = str(meta.get("method", "?"))
        try:
            family = get_method(method)[0].family
        except KeyError:
            family = None
        if family != "walla":
            raise HeadError(
                f"{run}: a {method} run; live agents need a WALLA run (walla-i, walla-ii, walla-i-log)"
            )
        if meta.get("calibration") is not None:  # train.calibrated: fitted temperatures not saved
            raise HeadError(
                f"{run}: trained with train.calibrated (every agent calibrated before every method), whose "
                "fitted temperatures walla train does not save, so a live agent cannot report what it pooled; "
                "use walla-i-cal (its temperatures are in its state.pt)"
            )
        if not (run / STATE).exists():
            scenario = run.parent.parent.parent
            meta_s = read_scenario_meta(scenario)
            command = retrain_command(meta_s, scenario.name, run.parent, method, run_seed(run), states=True)
            raise HeadError(
                f"{run}: no {STATE}: walla train writes one only with --save-states; rerun {command}"
            )
        # engine.save_checkpoint wrote it with a single-device Fabric, i.e. torch.save of this dict: read it
        # with torch.load (engine.load_checkpoint would import Lightning, seconds per agent process)
        state = torch.load(run / STATE, map_location="cpu", weights_only=False)
        return cls(state, slot, str(run))

    def _input(self, hidden: Sequence[np.ndarray]) -> torch.Tensor:
        """[b, H] hidden states (any float dtype) -> [1, b, H] float32 as walla.predict feeds them."""
        x = torch.from_numpy(np.stack([np.asarray(h) for h in hidden]))  # [b, H]
        if x.shape[1] != self.in_dim:
            raise ValueError(
                f"hidden state: expected {self.in_dim} values (the head's input), got {x.shape[1]}"
            )
        x = x.float()
        if self.stats is not None:
            x = (x - self.stats[0]) / self.stats[1]
        return x.unsqueeze(0).float()

    def wager(self, hidden: np.ndarray) -> float:
        return float(self.wagers([hidden])[0])

    def wagers(self, hidden: Sequence[np.ndarray]) -> np.ndarray:
        """Eval-mode wagers of b hidden states -> [b] float64."""
        with torch.no_grad():
            r = self.heads.predict(self._input(hidden)).double()  # [1, b]
        return torch.sigmoid(r[0] / self.cfg.temperature).numpy()

    def update(self, batch: Sequence[tuple[np.ndarray, float]]) -> float:
        """One training step on (hidden state, own advantage) pairs; returns the loss before the step."""
        if not batch:
            return float("nan")
        cfg = self.cfg
        if self.opt is None:
            self.fabric = make_fabric(TrainEnv())  # CPU, 32-bit: the run's step as walla train runs it
            self.opt = make_optimizer(self.heads.parameters(), "adam", cfg.lr)
        x = self._input([h for h, _ in batch])  # [1, b, H]
        adv = torch.tensor([a for _, a in batch], dtype=torch.float64)  # [b]
        keep = 1.0 - cfg.dropout
        masks = None
        if cfg.dropout > 0:
            masks = [
                torch.from_numpy(self.masks.random((1, len(batch), w), dtype=np.float32) < keep)
                for w in cfg.hidden
            ]
        self.heads.train()
        r = self.heads(x, masks).double()  # [1, b]
        w = torch.sigmoid(r / cfg.temperature).transpose(0, 1)  # [b, 1]: one agent
        loss = wager_loss(w, adv.unsqueeze(1), cfg.c3).sum()  # this agent's own loss
        optimizer_step(self.fabric, self.opt, loss, cfg.clip)
        self.heads.eval()
        self.steps += 1
        return float(loss.detach())
