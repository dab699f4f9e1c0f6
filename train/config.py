"""Config of one `walla-train` invocation (method configs live next to their methods: walla.Config in
train/methods/walla.py, CalibrationConfig in train/calibration.py). Superseded by train/plan.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def _check(ok: bool, name: str, allowed: str, value: Any) -> None:
    if not ok:
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


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
