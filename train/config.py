"""Configs of the train stage: WALLA heads, calibration heads, and one `walla-train` invocation.

Method configs arrive as plain dicts (registry defaults < scenario manifest `hparams` < CLI flags)
and are turned into these frozen dataclasses, which reject unknown keys and bad values with one
line naming the field, the allowed range and the value received.

SPEC §4.4 hyper-parameters differ per scenario family; they live in WALLA_PRESETS and are picked by
`preset` ("auto": soft targets -> bayesx, one model in every slot -> homogeneous, else hetero).
Explicit keys (lr, epochs, patience) override the preset.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from typing import Any

# SPEC §4.4 (reference configs); patience is in training BATCHES (online early stopping)
WALLA_PRESETS: dict[str, dict[str, Any]] = {
    "hetero": {"lr": 5e-7, "epochs": 50, "patience": 10_000},  # MMLU, MedMCQA, PubMedQA hetero
    "homogeneous": {"lr": 5e-5, "epochs": 5, "patience": 1_500},  # Aloe xM on PubMedQA
    "bayesx": {"lr": 5e-6, "epochs": 5, "patience": 1_500},  # Gemma xM on BayesX (rolling KL)
}
PRESETS = ("auto", *WALLA_PRESETS)


def _from_dict(cls, cfg: dict | None, what: str):
    cfg = dict(cfg or {})
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = [k for k in cfg if k not in names]
    if unknown:
        hints = []
        for k in unknown:
            close = difflib.get_close_matches(k, names, n=1)
            hints.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ValueError(
            f"{what}: unknown config key(s) {', '.join(hints)}; allowed: {', '.join(sorted(names))}"
        )
    return cls(**cfg)


def _check(ok: bool, name: str, allowed: str, value: Any) -> None:
    if not ok:
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


@dataclass(frozen=True)
class CalibrationConfig:
    """Adaptive temperature heads (SPEC §9); defaults are the reference's."""

    hidden: tuple[int, ...] = (256, 64)
    t0: float = 1.0  # initial temperature (last layer zero-init, bias = softplus^-1(t0 - t_min))
    t_min: float = 0.05  # T = softplus(out) + t_min, clamped at t_max
    t_max: float = 10.0
    lr: float = 1e-4  # AdamW
    weight_decay: float = 1e-5
    batch_size: int = 64
    epochs: int = 25
    clip: float = 1.0
    holdout: float = 0.1  # share of each head's training rows held out for early stopping
    patience: int = 5  # epochs without held-out NLL improvement (> min_delta)
    min_delta: float = 1e-8
    seed: int = 18  # head g: holdout, init and order seeded by seed + g (seed-independent)
    by_role: str = "auto"  # auto: one head per context role when the scenario routes context
    agents: tuple[int, ...] | None = None  # slots to calibrate; None = all (reference: Gemma only = (0,))
    min_rows: int = 20  # a role with fewer training rows keeps T = t0 (identity at t0 = 1)

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden))
        if self.agents is not None:
            object.__setattr__(self, "agents", tuple(int(a) for a in self.agents))
        _check(
            0 < self.t_min < self.t0 < self.t_max,
            "calibration t_min < t0 < t_max",
            "0 < t_min < t0 < t_max",
            (self.t_min, self.t0, self.t_max),
        )
        _check(self.lr > 0, "calibration lr", "> 0", self.lr)
        _check(self.batch_size >= 1, "calibration batch_size", ">= 1", self.batch_size)
        _check(self.epochs >= 1, "calibration epochs", ">= 1", self.epochs)
        _check(0 < self.holdout < 1, "calibration holdout", "in (0, 1)", self.holdout)
        _check(self.patience >= 1, "calibration patience", ">= 1", self.patience)
        _check(self.by_role in ("auto", "yes", "no"), "calibration by_role", "auto | yes | no", self.by_role)

    @classmethod
    def from_dict(cls, cfg: dict | None) -> CalibrationConfig:
        return _from_dict(cls, cfg, "calibration")


@dataclass(frozen=True)
class WallaConfig:
    """Decentralized WALLA wager heads (paper §3.3, SPEC §4-§5)."""

    variant: str = "I"  # "I": weighted-score baseline | "II": weighted-prediction baseline
    pooling: str = "linear"  # aggregate: linear | log (variant II's peer pool stays linear)
    preset: str = "auto"  # SPEC §4.4 family: auto | hetero | homogeneous | bayesx
    lr: float | None = None  # Adam lr; None = preset
    epochs: int | None = None  # None = preset
    patience: int | None = None  # training batches without window improvement; None = preset
    batch_size: int = 100
    temperature: float = 2.0  # wager = sigmoid(r / T)
    clip: float = 1.0  # per-agent gradient-norm clipping
    hidden: tuple[int, ...] = (512, 256)
    dropout: float = 0.1
    projection_dim: int | None = None  # 4096 reproduces the reference's per-agent projection
    c1: float = 1.0  # score s = c1 - c2 * Brier
    c2: float = 0.5
    c3: float = 0.5  # payout w (s - b - c3 w); target w* = clip((s - b) / 2c3, 0, 1)
    stop_metric: str = "auto"  # auto (kl for soft targets, else brier_regret) | brier_regret | kl | none
    window: int | None = None  # rolling window (batches); None = max(1, round(|val| / batch_size))
    shuffle: str = "once"  # training order: "once" per seed (SPEC §3.2) | "epoch"
    diagnostics: bool = False  # extra heads predicting own score and baseline (never used for wagers)
    calibrated: bool = False  # adaptive temperature heads before everything (SPEC §9)
    calibration: dict = field(default_factory=dict)  # CalibrationConfig overrides
    engine: str = "loop"  # loop | lightning: same steps (walla.py says why loop is default)
    device: str = "cpu"

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden))
        _check(self.variant in ("I", "II"), "variant", "'I' or 'II'", self.variant)
        _check(self.pooling in ("linear", "log"), "pooling", "'linear' or 'log'", self.pooling)
        _check(self.preset in PRESETS, "preset", " | ".join(PRESETS), self.preset)
        _check(self.lr is None or self.lr > 0, "lr", "> 0", self.lr)
        _check(self.epochs is None or self.epochs >= 1, "epochs", ">= 1", self.epochs)
        _check(self.patience is None or self.patience >= 1, "patience", ">= 1 batch", self.patience)
        _check(self.batch_size >= 1, "batch_size", ">= 1", self.batch_size)
        _check(self.temperature > 0, "temperature", "> 0", self.temperature)
        _check(self.clip > 0, "clip", "> 0", self.clip)
        _check(0 <= self.dropout < 1, "dropout", "in [0, 1)", self.dropout)
        _check(
            len(self.hidden) >= 1 and min(self.hidden) >= 1,
            "hidden",
            "a non-empty list of sizes",
            self.hidden,
        )
        _check(
            self.projection_dim is None or self.projection_dim >= 1,
            "projection_dim",
            ">= 1 or null",
            self.projection_dim,
        )
        _check(self.c2 > 0 and self.c3 > 0, "c2 and c3", "> 0", (self.c2, self.c3))
        _check(
            self.stop_metric in ("auto", "brier_regret", "kl", "none"),
            "stop_metric",
            "auto | brier_regret | kl | none",
            self.stop_metric,
        )
        _check(self.window is None or self.window >= 1, "window", ">= 1 batch or null", self.window)
        _check(self.shuffle in ("once", "epoch"), "shuffle", "'once' or 'epoch'", self.shuffle)
        _check(self.engine in ("loop", "lightning"), "engine", "'loop' or 'lightning'", self.engine)
        CalibrationConfig.from_dict(self.calibration)  # validate early

    @classmethod
    def from_dict(cls, cfg: dict | None) -> WallaConfig:
        return _from_dict(cls, cfg, "walla")

    def resolved(self, soft_target: bool, agents: list[str], n_val: int) -> WallaConfig:
        """Fill preset-dependent fields for a concrete scenario (recorded in run.json)."""
        preset = self.preset
        if preset == "auto":
            preset = "bayesx" if soft_target else ("homogeneous" if len(set(agents)) == 1 else "hetero")
        p = WALLA_PRESETS[preset]
        stop = self.stop_metric if self.stop_metric != "auto" else ("kl" if soft_target else "brier_regret")
        return dataclasses.replace(
            self,
            preset=preset,
            lr=self.lr if self.lr is not None else p["lr"],
            epochs=self.epochs if self.epochs is not None else p["epochs"],
            patience=self.patience if self.patience is not None else p["patience"],
            stop_metric=stop,
            window=self.window if self.window is not None else max(1, round(n_val / self.batch_size)),
        )

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["hidden"] = list(self.hidden)
        return d


@dataclass(frozen=True)
class TrainConfig:
    """One `walla-train` invocation (the CLI builds it; run.run_scenario consumes its fields)."""

    scenario: str  # scenario name or manifest path
    methods: tuple[str, ...] | None = None  # None = the scenario's own list
    seeds: tuple[int, ...] = (18, 19, 20, 21, 22)  # SPEC §4.5: 18 + r
    store: str = "walla-store"
    runs: str = "runs"
    device: str = "cpu"
    force: bool = False
    calibrated: bool = False  # calibrate agents for every WALLA method
    limit_rows: int | None = None  # keep ~N rows (split shares preserved) for quick looks

    def __post_init__(self) -> None:
        _check(len(self.seeds) >= 1, "seeds", "at least one seed", self.seeds)
        _check(len(set(self.seeds)) == len(self.seeds), "seeds", "distinct", self.seeds)
        _check(
            self.device in ("cpu", "cuda") or self.device.startswith("cuda:"),
            "device",
            "cpu | cuda",
            self.device,
        )
        _check(self.limit_rows is None or self.limit_rows >= 3, "limit_rows", ">= 3", self.limit_rows)
