"""The train recipe: one scenario x methods x seeds -> runs on disk (layout: train/runs.py).

    from walla.train.run import run_scenario
    summary = run_scenario(entry, ["uniform", "walla-i"], seeds=[18, 19], runs_dir="runs", store="walla-store")
    summary = run_scenario(scenario_data, ["walla-i"], seeds=[18], runs_dir="runs")   # already assembled

Read top to bottom:
    1. assemble the scenario (or take the given ScenarioData), optionally cut to --limit-rows;
    2. optionally calibrate every agent once (scenario `calibrated: true` / --calibrated): all methods
       then pool the calibrated probs, and each run records them as agent_probs;
    3. write scenario.parquet + scenario.json once;
    4. per method: resolve its config (registry defaults < scenario hparams < overrides), skip seeds whose
       run.json exists (unless force), fit the rest (all seeds batched in one module when the method
       offers fit_many), predict every row of every split, write predictions / train log / run.json.
Every fit runs with torch's and numpy's global RNGs seeded by the run's seed (restored afterwards),
on top of whatever seeding the method does itself, so a run never depends on what ran before it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from walla.store.scenario import ScenarioData
from walla.train import mechanism
from walla.train.calibration import apply_calibration, fit_calibration
from walla.train.methods import REGISTRY, MethodOutput, get_method
from walla.train.runs import is_complete, read_run, run_dir, write_run, write_scenario_table

DEFAULT_SEEDS = (18, 19, 20, 21, 22)  # SPEC §4.5: repeat r uses 18 + r
ProgressFn = Callable[[str, str, int | None], None]  # (event, method, seed): start | done | skipped


@dataclass
class RunResult:
    method: str
    seed: int
    status: str  # "done" | "skipped"
    path: Path
    wall_s: float
    test_brier: float
    test_acc: float


@dataclass
class ScenarioSummary:
    scenario: str
    runs_dir: Path
    results: list[RunResult] = field(default_factory=list)

    def by_method(self) -> dict[str, list[RunResult]]:
        out: dict[str, list[RunResult]] = {}
        for r in self.results:
            out.setdefault(r.method, []).append(r)
        return out


@contextmanager
def seeded_globals(seed: int) -> Iterator[None]:
    """torch + numpy global RNGs seeded for a block and restored afterwards."""
    np_state = np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        np.random.seed(seed % 2**32)
        try:
            yield
        finally:
            np.random.set_state(np_state)


def subset_rows(data: ScenarioData, rows: np.ndarray) -> ScenarioData:
    """A ScenarioData restricted to `rows` (in the given order)."""
    rows = np.asarray(rows, dtype=np.int64)
    return dataclasses.replace(
        data,
        question_id=data.question_id[rows],
        split=data.split[rows],
        question=[data.question[i] for i in rows],
        prompts=None if data.prompts is None else [[p[i] for i in rows] for p in data.prompts],
        n_options=data.n_options[rows],
        option_mask=data.option_mask[rows],
        probs=data.probs[rows],
        label=data.label[rows],
        target=data.target[rows],
        prompt_nll=data.prompt_nll[rows],
        variant=data.variant[rows],
        hidden=[np.asarray(h[rows]) for h in data.hidden],
        meta={**data.meta, "limit_rows": int(len(rows))},
    )


def limit_rows(data: ScenarioData, n: int) -> ScenarioData:
    """Keep about n rows, every split keeping its share (at least one row each), in stored order.

    The result is named "<scenario>-rows<n>" so its runs never mix with (or skip) full-scenario runs.
    """
    if n >= len(data.split):
        return data
    keep = []
    for s in ("train", "val", "test"):
        idx = data.split_index(s)
        if len(idx):
            keep.append(idx[: max(1, math.floor(n * len(idx) / len(data.split)))])
    return dataclasses.replace(subset_rows(data, np.sort(np.concatenate(keep))), name=f"{data.name}-rows{n}")


def test_scores(data: ScenarioData, agg: np.ndarray, rows: np.ndarray | None = None) -> tuple[float, float]:
    """(Brier, ACC) of an aggregate [N, K] on the test split: unhalved (expected) Brier, argmax accuracy."""
    test = data.split_index("test")
    if len(test) == 0:
        return math.nan, math.nan
    a = np.asarray(agg if rows is None else agg[rows])[test]
    brier = mechanism.brier_loss(
        torch.from_numpy(a.astype(np.float64)), torch.from_numpy(data.target[test].astype(np.float64))
    )
    return float(brier.mean()), float((a.argmax(1) == data.label[test]).mean())


def method_config(name: str, entry: Any | None, overrides: dict | None = None) -> dict:
    """Registry defaults < scenario manifest hparams (already family-resolved by the loader) < overrides."""
    info = REGISTRY[name]
    cfg = dict(info.defaults)
    if entry is not None:
        cfg.update((getattr(entry, "hparams", None) or {}).get(name) or {})
    cfg.update((overrides or {}).get(name) or {})
    return cfg


def _is_walla(name: str) -> bool:
    return REGISTRY[name].path.endswith(".walla")


def run_scenario(
    entry_or_data: Any,
    methods: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    runs_dir: str | Path = "runs",
    *,
    store: str | Path | None = None,
    force: bool = False,
    device: str = "cpu",
    calibrated: bool | None = None,
    limit: int | None = None,
    overrides: dict[str, dict] | None = None,
    progress: ProgressFn | None = None,
    entry: Any | None = None,
) -> ScenarioSummary:
    """Train and predict every (method, seed) of one scenario; see the module docstring.

    Args:
        entry_or_data: a ScenarioEntry (assembled from `store`) or an assembled ScenarioData.
        methods: registry names (default: the entry's list, else every registered method).
        seeds: default: the entry's seeds, else 18..22.
        runs_dir: root of the runs layout.
        store: feature store root (needed for a ScenarioEntry).
        force: rerun finished runs too.
        device: "cpu" | "cuda", passed to WALLA.
        calibrated: calibrate every agent before all methods (default: the entry's `calibrated`).
        limit: keep about this many rows (quick looks; written as scenario "<name>-rows<limit>").
        overrides: method -> config keys that win over the manifest.
        progress: callback (event, method, seed).
        entry: the ScenarioEntry of an already assembled ScenarioData (for its methods, seeds, hparams).

    Raises:
        KeyError: unknown method (with close-match suggestions). ValueError: bad config or data.
        walla.store errors (missing feature sets name the `make extract` command that creates them).
    """
    if isinstance(entry_or_data, ScenarioData):
        data = entry_or_data
    else:
        from walla.store.scenario import assemble_scenario

        entry = entry_or_data
        if store is None:
            raise ValueError(f"scenario {entry.name!r}: a store directory is needed to assemble it")
        data = assemble_scenario(entry, Path(store))
    methods = list(methods if methods is not None else (entry.methods if entry is not None else REGISTRY))
    seeds = [
        int(s)
        for s in (seeds if seeds is not None else (entry.seeds if entry is not None else DEFAULT_SEEDS))
    ]
    for name in methods:
        if name not in REGISTRY:
            get_method(name)  # raises KeyError with suggestions
    if limit is not None:
        data = limit_rows(data, limit)
    if calibrated is None:
        calibrated = bool(getattr(entry, "calibrated", False))
    runs_dir = Path(runs_dir)
    write_scenario_table(runs_dir, data, methods, seeds)
    raw_data = data
    cal_state = None
    if calibrated:  # one calibration for every method; WALLA's own `calibrated` is then switched off
        cal_state = fit_calibration(data, (overrides or {}).get("calibration"), device=device)
        data = dataclasses.replace(data, probs=apply_calibration(cal_state, data, np.arange(len(data.split))))

    summary = ScenarioSummary(data.name, runs_dir)
    all_rows = np.arange(len(data.split))
    for name in methods:
        info, module = get_method(name)
        cfg = method_config(name, entry, overrides)
        if _is_walla(name):
            if device != "cpu":
                cfg["device"] = device
            if calibrated:
                cfg["calibrated"] = False
        pending = [s for s in seeds if force or not is_complete(run_dir(runs_dir, data.name, name, s))]
        for s in seeds:
            if s not in pending:
                summary.results.append(_skipped(raw_data, name, s, runs_dir))
                if progress:
                    progress("skipped", name, s)
        if not pending:
            continue
        if progress:
            progress("start", name, None)
        resolved = module.resolve(data, cfg) if hasattr(module, "resolve") else cfg
        logs: dict[int, list[dict]] = {s: [] for s in pending}
        t0 = time.perf_counter()
        if hasattr(module, "fit_many") and len(pending) > 1:
            with seeded_globals(pending[0]):
                states = module.fit_many(data, cfg, pending, [logs[s].append for s in pending])
            fit_s = (time.perf_counter() - t0) / len(pending)
            fitted = list(zip(pending, states, [fit_s] * len(pending), strict=True))
        else:
            fitted = None
        for i, seed in enumerate(pending):
            t1 = time.perf_counter()
            if fitted is None:
                with seeded_globals(seed):
                    state = module.fit(data, cfg, seed, logs[seed].append)
                fit_s = time.perf_counter() - t1
                t1 = time.perf_counter()
            else:
                _, state, fit_s = fitted[i]
            with seeded_globals(seed), torch.no_grad():
                out = module.predict(state, data, all_rows)
            _check_output(out, data, name)
            if calibrated and "agent_probs" not in out.extras:
                out.extras["agent_probs"] = data.probs  # the calibrated probs this method pooled
            wall = fit_s + time.perf_counter() - t1
            brier, acc = test_scores(raw_data, out.agg_probs)
            meta = {
                "scenario": data.name,
                "method": name,
                "display_name": info.display,
                "group": info.group,
                "seed": seed,
                "config": resolved,
                "calibrated": "scenario" if calibrated else bool(resolved.get("calibrated", False)),
                "fingerprints": dict(data.fingerprints),
                "wall_time_s": wall,
                "batched_seeds": pending if fitted is not None else [seed],
                "n_rows": int(len(all_rows)),
                "limit_rows": limit,
                "device": device,
                "test_brier": brier,
                "test_acc": acc,
            }
            path = write_run(
                run_dir(runs_dir, data.name, name, seed), data.question_id, data.split, out, logs[seed], meta
            )
            summary.results.append(RunResult(name, seed, "done", path, wall, brier, acc))
            if progress:
                progress("done", name, seed)
    return summary


def _check_output(out: MethodOutput, data: ScenarioData, name: str) -> None:
    n, m, k = data.probs.shape
    if out.weights.shape != (n, m) or out.agg_probs.shape != (n, k):
        raise ValueError(
            f"method {name!r} returned weights {out.weights.shape} / agg_probs {out.agg_probs.shape}, "
            f"expected ({n}, {m}) / ({n}, {k})"
        )


def _skipped(data: ScenarioData, name: str, seed: int, runs_dir: Path) -> RunResult:
    rec = read_run(run_dir(runs_dir, data.name, name, seed))
    brier, acc = rec.meta.get("test_brier", math.nan), rec.meta.get("test_acc", math.nan)
    return RunResult(
        name, seed, "skipped", rec.path, float(rec.meta.get("wall_time_s", math.nan)), brier, acc
    )
