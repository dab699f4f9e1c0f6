"""EvalConfig: every setting of one `walla eval` report, validated by the one validator (manifests/validate.py).

Each field is also its `walla eval` option (cli/options.py generates them: `--scenario` -> scenarios,
`--plots/--no-plots` -> plots); the recipe is evaluate/report.py's `run`. The report goes under the runs
directory unless `--report` says otherwise, so the README's commands leave nothing in the checkout.
"""

from __future__ import annotations

from pathlib import Path

from walla.manifests.validate import config, option

REPORT_NAME = "tables.md"  # the default report, under --runs


@config
class EvalConfig:
    # the Markdown report; .tex, .csv and PNGs are written next to it
    report: Path | None = option(
        None, f"Markdown report to write; .tex/.csv/PNGs go next to it (default: <runs>/{REPORT_NAME})"
    )
    runs: Path = option(Path("runs"), "runs directory written by walla train")
    scenarios: tuple[str, ...] = option(
        (), "a scenario name under --runs (repeatable; default: every one)", flag="--scenario", repeat=True
    )
    plots: bool = option(True, "--no-plots: tables only")

    def __post_init__(self) -> None:
        if self.report is None:  # frozen: the default is set once, here
            object.__setattr__(self, "report", self.runs / REPORT_NAME)
        if self.report.suffix.lower() != ".md":
            raise ValueError(f"--report {self.report}: expected a .md path (.tex/.csv are written beside it)")
