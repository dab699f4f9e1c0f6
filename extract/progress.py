"""The extraction progress bar (rich): prompts/s, tokens/s and ETA, or nothing when disabled."""

from __future__ import annotations

import time

from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress


class Progress:
    """rich progress bar with prompts/s, tokens/s and ETA (or nothing when disabled)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.bar = None

    def __enter__(self):
        if self.enabled:
            self.bar = RichProgress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]}"),
                TimeRemainingColumn(),
                transient=False,
            )
            self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def task(self, description: str, total: int, done: int):
        self.t0, self.rows, self.tokens = time.perf_counter(), 0, 0
        if self.bar is not None:
            self.task_id = self.bar.add_task(description, total=total, completed=done, rate="")

    def advance(self, rows: int, tokens: int) -> None:
        self.rows += rows
        self.tokens += tokens
        if self.bar is not None:
            dt = max(time.perf_counter() - self.t0, 1e-9)
            self.bar.update(
                self.task_id,
                advance=rows,
                rate=f"{self.rows / dt:.1f} prompts/s {self.tokens / dt:,.0f} tok/s",
            )
