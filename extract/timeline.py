"""Where a whole `walla extract` went, from the process's start to its last line.

Why: the load line says where model loading went and the `wrote` line how long extraction took, but on an
H100 a warm 8B run took 26.7 s for 8.5 s of load and 6.5 s of extraction (issue 31) and nothing said where the
other 11.7 s went. The last line now does: start-up (the interpreter, imports and argument parsing before
`run`), reading the inputs, settling the backend, model load, extraction, and what is left (locks, the
question table, store commits). Only process exit comes after it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


def process_age() -> float | None:
    """Seconds since this process started (Linux's /proc, 10 ms resolution); None where that is unknown."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))  # field 22: start time
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class Timeline:
    """Seconds per named phase of one run; `line()` closes it with the rest as `other`."""

    started: float = field(default_factory=time.perf_counter)  # when the run began
    startup: float | None = field(default_factory=process_age)  # the process's age then
    phases: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - t

    def line(self) -> str:
        """`walla extract: done in T s: start-up a s, <phase> b s, ..., other c s` (T from the process's
        start where known, else from the run's)."""
        ran = time.perf_counter() - self.started
        parts = ([("start-up", self.startup)] if self.startup is not None else []) + list(self.phases.items())
        parts.append(("other", max(0.0, ran - sum(self.phases.values()))))
        total = ran + (self.startup or 0.0)
        since = "" if self.startup is not None else " (since the run began)"
        return f"walla extract: done in {total:.1f} s{since}: " + ", ".join(
            f"{k} {v:.1f} s" for k, v in parts
        )
