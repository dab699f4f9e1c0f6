"""The tables' significance marks and ECE intervals, checked by simulation through walla's own code.

    .venv/bin/python benchmarks/marks_coverage.py                  # 20,000 null tables per setting
    .venv/bin/python benchmarks/marks_coverage.py --draws 2000 --ece-draws 500    # a quick look

1. Family-wise error of the marks (significance.family_marks, what `annotate` runs on every column): the
   share of null accuracy columns (UniformAvg, 7 baselines, WALLA I, every row equally accurate; ‡ chosen
   on validation questions) with any mark, on 140 and 1000 questions, rows independent (rho 0) or copying
   a shared outcome per question (rho 0.5, 0.9); with its Monte-Carlo standard error and one-sided 95%
   upper bound (Wilson). The promise: the bound <= 0.055 (the rate itself <= 5%).
2. Power: WALLA I better by the difference the legend states for the null table's column (the median
   of `bootstrap.power_difference` over those tables): how often WALLA I is marked † (the legend says 80%).
3. ECE interval coverage (calibration_error.ece_debiased_resampled, ece_calibrated_draws,
   bootstrap.calibration_bounds: the code every ECE cell runs): predictors with 2 or 4 options whose
   population 20-bin ECE is exactly 0, 0.05 or 0.10 (evaluate/simulate.gap_predictors), 140 and 1000
   questions; coverage with its 95% lower bound (the promise: >= 0.93), the mean debiased estimate (its
   bias: the estimate minus the population ECE) and the mean interval width.

Seeded (--seed); numpy only, one BLAS thread (the report's own setting: small products). Last line:
RESULT fwer_max_upper=<bound> ece_min_coverage=<rate>
"""

# ruff: noqa: E402 (the options are read before the imports that load walla and numpy)
from __future__ import annotations

import argparse
import time


def parser() -> argparse.ArgumentParser:
    """The options, built before walla loads: --help and a mistyped flag answer at once (one line, exit 2)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], usage=argparse.SUPPRESS)
    ap.add_argument("--draws", type=int, default=20_000, help="null tables per FWER setting")
    ap.add_argument("--ece-draws", type=int, default=2_000, help="predictors per ECE setting")
    ap.add_argument("--power-draws", type=int, default=2_000, help="tables per power setting")
    ap.add_argument("--seed", type=int, default=37)
    return ap


if __name__ == "__main__":
    parser().parse_args()

import numpy as np
from threadpoolctl import threadpool_limits
from walla.evaluate.intervals.bootstrap import power_difference
from walla.evaluate.intervals.simulate import (
    ROWS,
    Rate,
    correlated_outcomes,
    ece_coverage,
    familywise_error,
    null_table_marks,
    report_counts,
)

SIZES = (140, 1000)
RHOS = (0.0, 0.5, 0.9)
OPTIONS = (2, 4)
GAPS = (0.0, 0.05, 0.10)
FWER_BOUND = 0.055
COVERAGE_FLOOR = 0.93


def stated_power_difference(n: int, tables: int, seed: int) -> float:
    """The median over null columns of the difference the legend states as detectable 80% of the time
    (`annotate` passes the column's family to `power_difference`: every row against UniformAvg, row 0,
    and against ‡, here row 1)."""
    rng = np.random.default_rng(seed)
    counts = report_counts(n)
    rows = np.r_[np.arange(1, ROWS), 0, np.arange(2, ROWS)]
    refs = np.r_[np.zeros(ROWS - 1, dtype=np.int64), np.ones(ROWS - 1, dtype=np.int64)]
    values = []
    for _ in range(tables):
        right = correlated_outcomes(rng, (1, ROWS), n, 0.6, 0.0)[0].astype(np.float64)  # [R, n]
        resamples = right @ counts / n  # [R, B]
        means = right.mean(-1)
        values.append(power_difference(means[rows] - means[refs], resamples[rows] - resamples[refs], n))
    return float(np.median(values))


def main() -> None:
    args = parser().parse_args()
    with threadpool_limits(limits=1):
        worst = 0.0
        print(
            f"Family-wise error per column (null tables: {args.draws} per setting; promise: upper <= 0.055)"
        )
        print(f"{'n':>5} {'rho':>4} {'rate':>7} {'MC se':>7} {'95% upper':>9}  {'s':>4}")
        for n in SIZES:
            for rho in RHOS:
                t0 = time.perf_counter()
                rate = familywise_error(n, args.draws, rho, args.seed)
                worst = max(worst, rate.upper())
                flag = "ok" if rate.upper() <= FWER_BOUND else "FAIL"
                print(
                    f"{n:>5} {rho:>4} {rate.value:>7.4f} {rate.se:>7.4f} {rate.upper():>9.4f}  "
                    f"{time.perf_counter() - t0:>4.0f}s {flag}",
                    flush=True,
                )
        print(f"\nPower (WALLA I better by the legend's 80% difference; {args.power_draws} tables)")
        print(f"{'n':>5} {'difference':>10} {'marked †':>9} {'MC se':>7}")
        for n in SIZES:
            delta = stated_power_difference(n, 200, args.seed)
            marked = null_table_marks(
                np.random.default_rng(args.seed + 1), args.power_draws, report_counts(n), 0.0, 0.6 + delta
            )
            power = Rate(int(marked[:, ROWS - 2].sum()), args.power_draws)  # WALLA I vs UniformAvg
            print(f"{n:>5} {100 * delta:>10.2f} {power.value:>9.3f} {power.se:>7.3f}", flush=True)
        least = 1.0
        print(f"\nECE interval coverage ({args.ece_draws} predictors per setting; promise: >= 0.93)")
        print(
            f"{'K':>2} {'n':>5} {'ECE':>5} {'coverage':>8} {'MC se':>6} {'95% lower':>9} "
            f"{'estimate':>8} {'bias':>7} {'width':>6}  {'s':>4}"
        )
        for k in OPTIONS:
            for n in SIZES:
                for gap in GAPS:
                    t0 = time.perf_counter()
                    c = ece_coverage(n, k, gap, args.ece_draws, args.seed)
                    least = min(least, c.covered.value)
                    flag = "ok" if c.covered.value >= COVERAGE_FLOOR else "FAIL"
                    print(
                        f"{k:>2} {n:>5} {gap:>5.2f} {c.covered.value:>8.3f} {c.covered.se:>6.3f} "
                        f"{c.covered.lower():>9.3f} {c.mean_estimate:>8.4f} {c.mean_estimate - gap:>+7.4f} "
                        f"{c.mean_width:>6.3f}  {time.perf_counter() - t0:>4.0f}s {flag}",
                        flush=True,
                    )
        print(f"RESULT fwer_max_upper={worst:.4f} ece_min_coverage={least:.3f}")


if __name__ == "__main__":
    main()
