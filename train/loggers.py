"""Per-run training loggers (Lightning's): the CSV curve every run keeps, plus TensorBoard / W&B on request.

    logs = RunLogger(run_dir, kind="tensorboard")   # CSV always; TensorBoard too
    logs({"step": 1, "loss": 0.3})                   # once per training batch (a method's LogFn)
    rows = logs.finish()                             # the rows, also in <run_dir>/logs/metrics.csv

The CSV log (`logs/metrics.csv`, Lightning's CSVLogger) is part of the run format (train/runs/_layout.py): the
plots read it. `kind` adds one more Lightning logger; a logger whose packages are not installed is one
line naming the packages to install. walla depends on Fabric alone (`lightning_fabric`), which has no W&B
logger: `--logger wandb` uses the one of the full `lightning` package, imported only then (the full
package also installs torchmetrics, which Fabric imports wherever it is installed: seconds per command).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from lightning_fabric.loggers import CSVLogger, TensorBoardLogger
from walla.manifests.validate import UsageError

LOGGERS = ("csv", "tensorboard", "wandb")
# per logger, the packages it needs: each entry is one requirement, met by any of its alternatives
_PACKAGES = {"tensorboard": (("tensorboard", "tensorboardX"),), "wandb": (("wandb",), ("lightning",))}


def check_logger(kind: str) -> None:
    """Raise ValueError (one line) for an unknown logger or one whose packages are missing."""
    if kind not in LOGGERS:
        raise UsageError(f"--logger must be one of {', '.join(LOGGERS)}, got {kind!r}")
    missing = [
        alts[0] for alts in _PACKAGES.get(kind, ()) if not any(importlib.util.find_spec(p) for p in alts)
    ]
    if missing:
        names = ", ".join(repr(p) for p in missing)
        raise UsageError(
            f"--logger {kind} needs the package{'s' * (len(missing) > 1)} {names}: pip install {' '.join(missing)}"
        )


class RunLogger:
    """A method's per-batch LogFn for one run: keeps the rows and feeds Lightning's loggers."""

    def __init__(self, run_dir: Path, kind: str = "csv", run_name: str = "") -> None:
        check_logger(kind)
        self.rows: list[dict] = []
        self.loggers = [CSVLogger(str(run_dir), name="logs", version="")]
        if kind == "tensorboard":
            self.loggers.append(TensorBoardLogger(str(run_dir), name="logs", version="tensorboard"))
        elif kind == "wandb":
            # the full `lightning` package's (Fabric has none): needs `lightning` and `wandb` (check_logger)
            from lightning.pytorch.loggers import WandbLogger

            self.loggers.append(WandbLogger(name=run_name, save_dir=str(run_dir)))

    def __call__(self, row: dict) -> None:
        self.rows.append(row)
        step = int(row.get("step", len(self.rows)))
        metrics = {k: float(v) for k, v in row.items() if k != "step"}
        for lg in self.loggers:
            lg.log_metrics(metrics, step=step)

    def finish(self) -> list[dict]:
        for lg in self.loggers:
            lg.finalize("success")
        return self.rows
