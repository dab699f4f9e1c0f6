"""Mean and 95% confidence interval of a metric over seeds (SPEC §4.5).

margin = t_{0.975, n-1} * std(ddof=1) / sqrt(n) over the finite values; non-finite values (an AUC that is
undefined on one seed) are dropped first; no interval for fewer than 2 finite values. Deterministic
methods (UniformAvg, ...) give identical values on every seed and so a zero-width interval (SPEC §10.22).
Values stay raw fractions here; tables apply the display scale (x100).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Summary:
    mean: float  # NaN when no value is finite
    ci: float | None  # half-width of the 95% t-interval; None for n < 2
    n: int  # finite values used
    n_total: int  # values given (seeds), finite or not

    @property
    def defined(self) -> bool:
        return self.n > 0

    @property
    def partial(self) -> bool:
        """Some seeds gave a non-finite value and were left out of the mean."""
        return 0 < self.n < self.n_total

    def scaled(self, factor: float) -> Summary:
        ci = None if self.ci is None else self.ci * factor
        return Summary(self.mean * factor, ci, self.n, self.n_total)


def t_margin(std: float, n: int, confidence: float = CONFIDENCE) -> float:
    """Half-width t_{(1+c)/2, n-1} * std / sqrt(n) of the two-sided t-interval."""
    return float(stats.t.ppf(0.5 + confidence / 2, df=n - 1) * std / math.sqrt(n))


def summarize(values: Iterable[float], confidence: float = CONFIDENCE) -> Summary:
    """Mean and t-interval half-width of the finite `values` (one per seed)."""
    arr = np.asarray(list(values), dtype=np.float64)
    finite = arr[np.isfinite(arr)]
    n = int(finite.size)
    if n == 0:
        return Summary(float("nan"), None, 0, int(arr.size))
    mean = float(finite.mean())
    if n < 2:
        return Summary(mean, None, n, int(arr.size))
    if np.ptp(finite) == 0:  # identical seeds: exactly zero width (the float mean may be off by an ulp)
        return Summary(mean, 0.0, n, int(arr.size))
    return Summary(mean, t_margin(float(finite.std(ddof=1)), n, confidence), n, int(arr.size))
