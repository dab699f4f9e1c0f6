"""PNG figures of the paper, drawn from saved runs only (matplotlib, Agg backend).

Per scenario:
* alignment  learned wager vs realized advantage s_i - b_-i (the paper's alignment figure), Pearson r;
* heads      predicted own score / predicted baseline vs the realized ones, and wager vs their difference
             (only when a run saved the diagnostic heads: pred_score / pred_baseline non-null);
* training   the metrics of the run's training curve (logs/metrics.csv: D-Regret, MRR, ACC, ...) over
             training batches;
* reliability  reliability diagram of the aggregate, WALLA I vs UniformAvg;
* compute    accuracy (Brier on soft targets) vs LLM compute per question, every method (compute.py).
Each function returns the written path, or None when the runs hold nothing to draw.
"""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
from walla.evaluate.calibration_error import ECE_BINS, ece, reliability  # noqa: E402
from walla.evaluate.compute import ScenarioCompute  # noqa: E402
from walla.evaluate.load import Run, ScenarioRuns  # noqa: E402
from walla.evaluate.metrics import METRICS  # noqa: E402
from walla.store.atomic import write_file  # noqa: E402
from walla.store.schema import VARIANTS  # noqa: E402
from walla.train.mechanism import brier_score  # noqa: E402

MAX_POINTS = 20_000  # scatter points drawn (Pearson r always uses every point)
LOG_AXES = ("step", "epoch", "n_seen")  # training-log columns that are x-axes, not metrics
LOG_SKIP = ("grad_norm", "skipped")  # bookkeeping columns, not metrics
# train_log metrics shown first, in this order (substring match); per-agent columns (wager_0, ...) are skipped
PREFERRED = (
    "regret",
    "mrr",
    "acc",
    "kl",
    "window_metric",
    "stop_metric",
    "payout_mean",
    "wager_mean",
    "loss",
)
LOG_TITLES = {  # what WALLA's own log columns mean (train/methods/walla.py)
    "stop_metric": "early-stopping metric per batch\n(D-Regret; KL on soft targets)",
    "window_metric": "early-stopping metric, window mean\n(D-Regret; KL on soft targets)",
    "payout_mean": "mean net payout per agent",
    "wager_mean": "mean wager",
    "advantage_mean": "mean realized advantage",
    "loss": "training loss",
}
MAX_PANELS = 4


def _save(fig, path: Path) -> Path:
    """Write the PNG atomically (a crash never leaves half a PNG) and close the figure."""
    try:
        return write_file(path, lambda p: fig.savefig(p, format="png", dpi=110, bbox_inches="tight"))
    finally:
        plt.close(fig)


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson r of finite pairs; NaN when fewer than 2 or either side is constant."""
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def _walla_run(data: ScenarioRuns, need: tuple[str, ...]) -> Run | None:
    """The lowest-seed run of WALLA I (else the first WALLA method) that saved every column in `need`."""
    methods = sorted(
        (m for m, r in data.runs.items() if next(iter(r.values())).group == "walla"),
        key=lambda m: m != "walla-i",
    )
    for method in methods:
        for _, run in sorted(data.runs[method].items()):
            if all(k in run.extras for k in need):
                return run
    return None


def _consts(run: Run) -> tuple[float, float]:
    """(c1, c2) of the run's mechanism (run.json, top level or under config/hparams), paper defaults else."""
    for d in (run.meta, run.meta.get("config") or {}, run.meta.get("hparams") or {}):
        if isinstance(d, dict) and "c1" in d and "c2" in d:
            return float(d["c1"]), float(d["c2"])
    return 1.0, 0.5


def _groups(data: ScenarioRuns, m: int) -> tuple[np.ndarray, list[str]]:
    """[N, M] group code per (question, agent) and the group names: the context variant when the
    scenario routes contexts, else the agent slot."""
    s = data.scenario
    n = len(s.label)
    if s.variant is not None and (s.variant != 0).any():
        return s.variant.astype(int), [f"{v} context" for v in VARIANTS]
    return np.broadcast_to(np.arange(m), (n, m)), [f"agent {i + 1}: {a}" for i, a in enumerate(s.agents)]


def _scatter(ax, x, y, groups, names, rng) -> None:
    """Scatter (subsampled to MAX_POINTS) colored by group, with each group's Pearson r in the legend."""
    x, y, groups = x.ravel(), y.ravel(), groups.ravel()
    keep = np.arange(len(x)) if len(x) <= MAX_POINTS else rng.choice(len(x), MAX_POINTS, replace=False)
    for g in np.unique(groups):
        sel = groups == g
        shown = keep[sel[keep]]
        ax.scatter(
            x[shown], y[shown], s=6, alpha=0.4, label=f"{names[g]} (r = {pearson(x[sel], y[sel]):.2f})"
        )
    ax.legend(fontsize=7, markerscale=2, loc="best")


def alignment_plot(data: ScenarioRuns, path: Path) -> Path | None:
    """Learned wager (x) vs realized advantage s_i - b_-i (y), every agent, test split, one seed."""
    run = _walla_run(data, ("wagers", "advantage"))
    if run is None:
        return None
    w, adv = run.extras["wagers"], run.extras["advantage"]  # [N, M] each
    groups, names = _groups(data, w.shape[1])
    fig, ax = plt.subplots(figsize=(6, 4.5))
    _scatter(ax, w, adv, groups, names, np.random.default_rng(0))
    lo, hi = 0.0, float(np.nanmax(w)) if np.isfinite(w).any() else 1.0
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="_y = x")
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xlabel("learned wager $w_i$")
    ax.set_ylabel("realized advantage $s_i - b_{-i}$")
    ax.set_title(
        f"Wager vs realized advantage: {run.display}, {data.scenario.name}\n"
        f"test split, seed {run.seed}; Pearson r = {pearson(w.ravel(), adv.ravel()):.3f} (dashed: y = x)",
        fontsize=9,
    )
    return _save(fig, path)


def heads_plot(data: ScenarioRuns, path: Path) -> Path | None:
    """Diagnostic heads: predicted vs realized own score, predicted vs realized baseline, wager vs difference."""
    run = _walla_run(data, ("wagers", "pred_score", "pred_baseline"))
    if run is None:
        return None
    s = data.scenario
    probs = run.agent_probs if run.agent_probs is not None else s.probs  # [N, M, K]
    c1, c2 = _consts(run)
    target = np.broadcast_to(s.target[:, None, :], probs.shape)
    own = brier_score(  # [N, M] realized s_i
        torch.from_numpy(np.ascontiguousarray(probs)),
        torch.from_numpy(np.ascontiguousarray(target)),
        c1=c1,
        c2=c2,
    ).numpy()
    w, ps, pb = run.extras["wagers"], run.extras["pred_score"], run.extras["pred_baseline"]
    panels = [(own, ps, "realized own score $s_i$", "predicted own score")]
    if "advantage" in run.extras:
        panels.append((own - run.extras["advantage"], pb, "realized baseline $b_{-i}$", "predicted baseline"))
    panels.append((w, ps - pb, "learned wager $w_i$", "predicted own score - predicted baseline"))
    groups, names = _groups(data, w.shape[1])
    rng = np.random.default_rng(0)
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.2))
    for ax, (x, y, xl, yl) in zip(np.atleast_1d(axes), panels, strict=True):
        _scatter(ax, x, y, groups, names, rng)
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        ax.set_title(
            f"{yl} vs {xl.split(' $')[0]}\nPearson r = {pearson(x.ravel(), y.ravel()):.3f}", fontsize=9
        )
    fig.suptitle(f"Diagnostic heads of {run.display}, {s.name} (test split, seed {run.seed})", fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def _log_metrics(columns: list[str]) -> list[str]:
    cols = [c for c in columns if c not in LOG_AXES + LOG_SKIP and not re.search(r"_\d+$", c)]
    ranked = sorted(
        cols, key=lambda c: next((i for i, p in enumerate(PREFERRED) if p in c.lower()), len(PREFERRED))
    )
    return ranked[:MAX_PANELS]


def rolling_mean(y: np.ndarray, k: int) -> np.ndarray:
    """Mean of the finite values in each window of k ([len - k + 1]); NaN where a window has none."""
    ok = np.isfinite(y)
    csum = np.concatenate([[0.0], np.cumsum(np.where(ok, y, 0.0))])
    cnt = np.concatenate([[0], np.cumsum(ok)])
    n = cnt[k:] - cnt[:-k]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, (csum[k:] - csum[:-k]) / n, np.nan)


def training_plot(data: ScenarioRuns, path: Path) -> Path | None:
    """Metrics logged per training batch for the WALLA methods, one line per seed, rolling mean."""
    logs = [
        run
        for by_seed in data.runs.values()
        for run in by_seed.values()
        if run.group == "walla" and run.train_log is not None and run.train_log.height > 0
    ]
    if not logs:
        return None
    numeric = [c for c, t in logs[0].train_log.schema.items() if t.is_numeric()]
    metrics = _log_metrics(numeric)
    if not metrics:
        return None
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.6 * len(metrics), 3.8), squeeze=False)
    colors = {m: f"C{i}" for i, m in enumerate(dict.fromkeys(r.display for r in logs))}  # one per row
    windows = set()
    for ax, metric in zip(axes[0], metrics, strict=True):
        for run in logs:
            log = run.train_log
            if metric not in log.columns:
                continue
            xcol = "n_seen" if "n_seen" in log.columns else "step" if "step" in log.columns else None
            y = log[metric].cast(float).to_numpy()
            x = log[xcol].to_numpy() if xcol else np.arange(len(y))
            k = max(1, len(y) // 50)
            windows.add(k)
            label = run.display if run.seed == min(r.seed for r in logs if r.display == run.display) else None
            ax.plot(x[k - 1 :], rolling_mean(y, k), color=colors[run.display], lw=1, alpha=0.8, label=label)
        ax.set_xlabel("training examples seen" if "n_seen" in logs[0].train_log.columns else "training batch")
        ax.set_title(LOG_TITLES.get(metric, metric), fontsize=9)
        ax.xaxis.set_major_locator(MaxNLocator(5))
        ax.ticklabel_format(axis="x", style="sci", scilimits=(-3, 4))
        ax.legend(fontsize=7)
    k = max(windows) if windows else 1
    smoothing = f"rolling mean over up to {k} batches" if k > 1 else "no smoothing"
    fig.suptitle(
        f"Training metrics over time, {data.scenario.name} (per training batch, {smoothing}, one line per seed)",
        fontsize=10,
    )
    fig.tight_layout()
    return _save(fig, path)


def reliability_plot(data: ScenarioRuns, path: Path) -> Path | None:
    """Reliability diagram of the aggregate (test split, seeds pooled): WALLA I vs UniformAvg. The legend's
    ECE is the plug-in value of the plotted bins (the tables show the debiased one, calibration_error.ece_debiased)."""
    s = data.scenario
    chosen = [m for m in ("walla-i", "uniform") if m in data.runs]
    if not chosen:
        return None
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.plot([0, 1], [0, 1], "k--", lw=0.8, label="perfect calibration")
    for method in chosen:
        runs = list(data.runs[method].values())
        p = np.concatenate([r.agg_probs for r in runs])  # [seeds*N, K]
        label = np.tile(s.label, len(runs))
        count, conf, acc = reliability(p, label)
        used = count > 0
        ax.plot(
            conf[used],
            acc[used],
            "o-",
            ms=4,
            label=f"{runs[0].display} (plug-in ECE = {100 * ece(p, label):.2f})",
        )
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("mean confidence (max aggregated probability) per bin")
    ax.set_ylabel("accuracy per bin")
    ax.set_title(
        f"Reliability of the aggregate, {s.name}\n(test split, {ECE_BINS} bins, seeds pooled)", fontsize=9
    )
    ax.legend(fontsize=8)
    return _save(fig, path)


GROUP_MARKERS = {"individual": "s", "learning_free": "^", "learning_based": "D", "walla": "o"}


def compute_plot(sc: ScenarioCompute, scenario: str, path: Path) -> Path | None:
    """Quality (accuracy, or Brier on soft targets) vs LLM compute per question: agents and every method
    on one figure, 95% CI over seeds as error bars."""
    pts = [p for p in sc.points if p.quality.defined and np.isfinite(p.flops) and p.flops > 0]
    if not pts:
        return None
    q = METRICS[sc.metric]
    fig, ax = plt.subplots(figsize=(7, 5))
    for i, p in enumerate(pts):
        ci = 0.0 if p.quality.ci is None else p.quality.ci * q.scale
        x, y = p.flops / 1e9, p.quality.mean * q.scale
        label = f"{p.label} ({p.agents:g} agent{'s' if p.agents != 1 else ''})"
        marker = GROUP_MARKERS.get(p.group, "o")
        ax.errorbar(x, y, yerr=ci, fmt=marker, color=f"C{i % 10}", ms=7, capsize=3, label=label)
    flops = [p.flops for p in pts]
    if max(flops) / min(flops) > 20:
        ax.set_xscale("log")
    ax.set_xlabel("forward GFLOPs per question (agents run)")
    ax.set_ylabel(
        f"{q.label}" + (" (×100)" if q.scale == 100.0 else "") + (" ↑" if q.higher_is_better else " ↓")
    )
    ax.set_title(
        f"{q.label} vs LLM compute per question, {scenario}\n(test split; mean ± 95% CI over seeds; "
        "methods at the same x run the same agents)",
        fontsize=9,
    )
    ax.legend(fontsize=7, loc="best")
    return _save(fig, path)


def selective_plot(curves: dict, scenario: str, path: Path) -> Path | None:
    """Accuracy of the most confident answers vs coverage, one line per method (evaluate/selective.py)."""
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for label, (cov, acc) in curves.items():
        style = "-" if label.startswith("WALLA") else "--" if "LENS" in label else ":"
        ax.plot(cov * 100, acc * 100, style, lw=1.2, label=label)
    ax.set_xlabel("coverage: share of test questions answered (most confident first), %")
    ax.set_ylabel("accuracy on the answered questions, %")
    ax.set_title(f"Selective answers: accuracy vs coverage, {scenario}\n(seed mean)", fontsize=9)
    ax.legend(fontsize=6, ncol=2, loc="best")
    return _save(fig, path)


def scenario_plots(
    data: ScenarioRuns, prefix: Path, compute: ScenarioCompute | None = None
) -> list[tuple[Path, str]]:
    """Every plot the scenario's runs support: (path, caption) pairs, written as <prefix>-<kind>.png."""
    out = []
    for kind, fn, caption in (
        ("alignment", alignment_plot, "Learned wager vs realized advantage"),
        ("heads", heads_plot, "Diagnostic heads: predicted vs realized score and baseline"),
        ("training", training_plot, "Training metrics over time"),
        ("reliability", reliability_plot, "Reliability diagram of the aggregate"),
    ):
        path = fn(data, Path(f"{prefix}-{kind}.png"))
        if path is not None:
            out.append((path, caption))
    if compute is not None and (
        path := compute_plot(compute, data.scenario.name, Path(f"{prefix}-compute.png"))
    ):
        out.append((path, f"{METRICS[compute.metric].label} vs LLM compute per question"))
    return out
