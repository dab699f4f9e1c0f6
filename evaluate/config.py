"""EvalConfig: every setting of one `walla eval` report, validated by the one validator (manifests/validate.py).

Each field is named as its `walla eval` option (`--scenario` -> scenarios, `--plots/--no-plots` -> plots),
so the command passes its options through unchanged; the recipe is evaluate/report.py's `run`.
"""

from __future__ import annotations

from pathlib import Path

from walla.manifests.validate import config


@config
class EvalConfig:
    report: Path  # the Markdown report; .tex, .csv and PNGs are written next to it
    runs: Path = Path("runs")  # written by walla train
    scenarios: tuple[str, ...] = ()  # empty: every scenario under runs
    plots: bool = True  # False: tables only

    def __post_init__(self) -> None:
        if self.report.suffix.lower() != ".md":
            raise ValueError(f"--report {self.report}: expected a .md path (.tex/.csv are written beside it)")
