"""The train recipe: a TrainPlan on an assembled scenario -> runs on disk (format: train/runs/_layout.py).

    run(build(TrainConfig, {"scenario": "demo-hetero-facts"}, "command line"))  # what `walla train` does
    plan = load_plan("demo-hetero-facts")                       # or step by step: train/plan.py
    data = assemble_scenario(plan.scenario, Path("walla-store"))  # store/scenario/_assemble.py
    results = run_plan(plan, data, "runs", TrainEnv(device="cpu"))

`run(cfg)` resolves the plan (train/resolve.py: a manifest, a kind built from the store, agents
joining), assembles the scenario, then calls `run_plan` under a progress bar and prints the summary table.

Read top to bottom:
    1. take the runs directory's lock for this scenario (one walla train writer at a time);
    2. write scenario.parquet + scenario.json (rewritten only when the scenario's inputs changed);
    3. optionally calibrate every agent once (plan.calibrated): every method then pools the calibrated
       probabilities, and each run records them as agent_probs;
    4. per method: its run key (train/runs/_identity.py: config, calibration, precision, device kind, init, the
       scenario's inputs) names the directory <method>/<key-id>/, so another configuration trains beside
       the first; the runs still to do (train/runs/_pending.py) are the seeds with no complete run there, or
       whose run was trained from other inputs or by another schema (stale), or all with force; fit them
       (seeds batched where the method can), predict every row of every split, write logs/,
       predictions.parquet and run.json (last), and state.pt only for the methods named by `save_states`
       (--save-states, train/resolve.py).
States are written only where something uses them: joining (train/join.py continues the base runs' WALLA
heads) and the live market (market/head.py) read them; the tables need only the predictions. A demo seed's
WALLA state is ~7 MB and a paper one's ~0.9 GB against a few hundred kB of predictions, so by default no
run writes one; a complete run of a method in `save_states` that has none is trained again to write it.
Every fit runs with torch's and numpy's global RNGs seeded by the first pending seed (restored
afterwards), on top of the method's own seeding, so a run never depends on what ran before it.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import sys
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from filelock import FileLock, Timeout
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from walla.manifests.validate import to_dict
from walla.store.location import as_location
from walla.store.scenario import ScenarioData, assemble_scenario
from walla.train import mechanism
from walla.train.calibration import apply_calibration, fit_calibration
from walla.train.config import TrainConfig
from walla.train.engine import TrainEnv, resolve_device, resolve_precision, save_checkpoint
from walla.train.join import initial_params, train_command
from walla.train.loggers import RunLogger, check_logger
from walla.train.methods import MethodOutput, method_module
from walla.train.plan import TrainPlan, plan_yaml
from walla.train.resolve import resolve_plan, states_to_save
from walla.train.runs import (
    LOCK,
    RUN_META,
    STATE,
    Continued,
    inputs_id,
    key_id,
    keys_beside,
    pending_runs,
    plan_key,
    run_dir,
    scenario_dir,
    write_key_file,
    write_run,
    write_scenario_table,
)

ProgressFn = Callable[[str, str, int | None], None]  # (event, method, seed): start | done | skipped


class RunsLockedError(RuntimeError):
    """Another walla train holds this scenario's runs directory."""


@contextmanager
def runs_lock(runs: Path, scenario: str) -> Iterator[None]:
    """One walla train per runs directory and scenario (the lock dies with its process)."""
    d = scenario_dir(runs, scenario)
    d.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(d / LOCK))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise RunsLockedError(
            f"{d}: another walla train is writing runs of scenario {scenario!r} (lock {d / LOCK}); "
            "wait for it to finish or use another --runs directory"
        ) from None
    try:
        yield
    finally:
        lock.release()


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


def test_scores(data: ScenarioData, agg: np.ndarray) -> tuple[float, float]:
    """(Brier, ACC) of an aggregate [N, K] on the test split: unhalved (expected) Brier, argmax accuracy."""
    test = data.split_index("test")
    if len(test) == 0:
        return math.nan, math.nan
    a = torch.from_numpy(np.asarray(agg, dtype=np.float64)[test])
    brier = mechanism.brier_loss(a, torch.from_numpy(data.target[test].astype(np.float64)))
    return float(brier.mean()), float((a.argmax(1).numpy() == data.label[test]).mean())


def check_data(plan: TrainPlan, data: ScenarioData) -> None:
    """Refuse scenarios too small to train and evaluate on (numbers named)."""
    sizes = {s: len(data.split_index(s)) for s in ("train", "val", "test")}
    short = [f"{s} {n}" for s, n in sizes.items() if n < 1]
    need_test = 2 if len(plan.seeds) > 1 else 1
    if short or sizes["test"] < need_test:
        raise ValueError(
            f"scenario {data.name!r} has {sizes['train']} train / {sizes['val']} val / {sizes['test']} test "
            f"questions; training needs >= 1 train and >= 1 val row and evaluation >= {need_test} test "
            "questions: extract more questions (e.g. a larger --size or --limit)"
        )


def run_plan(
    plan: TrainPlan,
    data: ScenarioData,
    runs_dir: str | Path,
    env: TrainEnv,
    *,
    force: bool = False,
    logger: str = "csv",
    progress: ProgressFn | None = None,
    note: Callable[[str], None] = print,
    initial: dict[str, Continued] | None = None,
    save_states: Collection[str] = (),
    command: str | None = None,
) -> list[dict]:
    """Train and predict every (method, seed) of a plan; returns the run.json of every run, in order.

    Raises:
        RunsLockedError: another walla train holds the scenario. ValueError: data too small, bad output.

    `initial` (train/join.py): method -> the base runs its runs continue from; their run key names the
    base key, and each seed's inputs id its base run's. `save_states`: the methods whose runs write
    state.pt (states_to_save); the others write none. `command`: the `walla train` command of this
    scenario and settings (join.train_command), recorded in scenario.json and each key's key.json for the
    messages that say how to retrain.
    """
    runs = Path(runs_dir)
    if runs.exists() and not runs.is_dir():
        raise ValueError(f"--runs {runs}: is a file, expected a directory for the runs")
    check_data(plan, data)
    spec = to_dict(plan.spec)
    results: list[dict] = []
    with runs_lock(runs, data.name):
        scen = write_scenario_table(runs, data, spec, [m.name for m in plan.methods], plan.seeds, command)
        raw = data
        if plan.calibrated:  # one calibration for every method
            cal = fit_calibration(data, plan.calibration, env)
            data = dataclasses.replace(
                data, probs=apply_calibration(cal, data, np.arange(len(data.split)), env)
            )
        calibration = to_dict(plan.calibration) if plan.calibrated else None
        all_rows = np.arange(len(data.split))
        for mp in plan.methods:
            module = method_module(mp.name)
            cont = (initial or {}).get(mp.name)
            cfg, key = plan_key(plan, mp, raw, env, cont)
            cfg_dict = to_dict(cfg)
            assert key["scenario_inputs_id"] == scen["inputs_id"]  # the key's inputs are the table's
            kid = key_id(key)
            ids = {s: inputs_id(key, s, *([cont.base_ids[s]] if cont else [])) for s in plan.seeds}
            write_key_file(runs, data.name, key, plan.seeds, command)
            keep_state = mp.name in save_states
            pending, kept, notes = pending_runs(runs, data, mp.name, kid, plan.seeds, ids, force, keep_state)
            notes += keys_beside(runs, data.name, mp.name, kid)
            for line in notes:
                note(line)
            for s, meta in kept.items():
                results.append({"status": "skipped", **meta})
                if progress:
                    progress("skipped", mp.name, s)
            if not pending:
                continue
            if progress:
                progress("start", mp.name, None)
            for s in pending:  # a run being redone is incomplete from now on, its old curve and state gone
                (run_dir(runs, data.name, mp.name, kid, s) / RUN_META).unlink(missing_ok=True)
                (run_dir(runs, data.name, mp.name, kid, s) / STATE).unlink(missing_ok=True)
                shutil.rmtree(run_dir(runs, data.name, mp.name, kid, s) / "logs", ignore_errors=True)
            logs = [
                RunLogger(
                    run_dir(runs, data.name, mp.name, kid, s), logger, f"{data.name}/{mp.name}/{kid}/{s}"
                )
                for s in pending
            ]
            t0 = time.perf_counter()
            with seeded_globals(pending[0]):
                extra = {"initial": [cont.params[s] for s in pending]} if cont else {}
                states = module.fit(data, cfg, pending, env, logs, **extra)
            fit_s = (time.perf_counter() - t0) / len(pending)
            for seed, state, log in zip(pending, states, logs, strict=True):
                t1 = time.perf_counter()
                with seeded_globals(seed), torch.no_grad():
                    out = module.predict(state, data, all_rows, env)
                _check_output(out, data, mp.name)
                if plan.calibrated and "agent_probs" not in out.extras:
                    out.extras["agent_probs"] = data.probs  # the calibrated probs this method pooled
                brier, acc = test_scores(raw, out.agg_probs)
                path = run_dir(runs, data.name, mp.name, kid, seed)
                log.finish()
                if state is not None and keep_state:
                    save_checkpoint(path / STATE, state)
                meta = {
                    "scenario": data.name,
                    "method": mp.name,
                    "display_name": mp.display,
                    "group": mp.info.group,
                    "seed": seed,
                    "config": cfg_dict,
                    "calibration": calibration,
                    "run_key": key,
                    "key_id": kid,
                    "inputs_id": ids[seed],
                    "initialized": cont.init if cont else "default init",
                    **({"continued": cont.base_run(seed)} if cont else {}),
                    "scenario_inputs_id": scen["inputs_id"],
                    "fingerprints": dict(data.fingerprints),
                    "wall_time_s": fit_s + time.perf_counter() - t1,
                    "batched_seeds": pending,
                    "n_rows": int(len(all_rows)),
                    "device": env.device,
                    "precision": env.precision,
                    "test_brier": brier,
                    "test_acc": acc,
                }
                write_run(path, data.question_id, data.split, out, meta)
                results.append({"status": "done", **meta})
                if progress:
                    progress("done", mp.name, seed)
            # the states live on the training device until saved: freed before the next method sizes its fit
            del states, state
    return results


def _check_output(out: MethodOutput, data: ScenarioData, name: str) -> None:
    n, m, k = data.probs.shape
    if out.weights.shape != (n, m) or out.agg_probs.shape != (n, k):
        raise ValueError(
            f"method {name!r} returned weights {out.weights.shape} / agg_probs {out.agg_probs.shape}, "
            f"expected ({n}, {m}) / ({n}, {k})"
        )


def run(cfg: TrainConfig, console: Console | None = None) -> list[dict]:
    """`walla train`: resolve the plan, assemble the scenario, train every method x seed, print a summary.

    Raises:
        ValueError, KeyError, FileNotFoundError: a bad option, scenario or store (one line, naming it).
        RunsLockedError: another walla train holds the scenario.
    """
    console = console or Console()
    store = as_location(cfg.store)  # a local Path (the fast path) or a RemotePath over fsspec
    if not cfg.show_plan:  # what this machine lacks is a usage error, answered before the store is read
        check_logger(cfg.logger)
        dev = resolve_device(cfg.device)
    plan, preset_line, base_plan, origin = resolve_plan(cfg, store)
    states = states_to_save(cfg.save_states, plan)
    if cfg.show_plan:
        sys.stdout.write((f"# {preset_line}\n" if preset_line else "") + plan_yaml(plan))
        return []
    if preset_line:
        console.print(preset_line, highlight=False, markup=False)

    env = TrainEnv(device=dev, precision=resolve_precision(cfg.precision, dev), store=store)
    if not store.is_dir():
        raise FileNotFoundError(
            f"store {cfg.store} does not exist (run `walla extract ...` first, or pass --store)"
        )
    data = assemble_scenario(plan.scenario, store)
    if cfg.limit_rows is not None:
        data = data.limit_rows(cfg.limit_rows)
    initial = None
    if origin is not None and not cfg.from_scratch:  # continue the base runs of this command's key
        base_data = assemble_scenario(base_plan.scenario, store)
        if cfg.limit_rows is not None:
            base_data = base_data.limit_rows(cfg.limit_rows)
        base_command = train_command(cfg, base=True, settings=True)
        initial = initial_params(base_plan, plan, origin, base_data, data, cfg.runs, env, base_command)
    console.print(
        f"walla train: scenario [bold]{data.name}[/] ({len(data.split)} questions, {data.n_agents} agents), "
        f"{len(plan.methods)} methods x {len(plan.seeds)} seeds on {env.device} ({env.precision}) -> {cfg.runs}"
    )
    columns = (TextColumn("{task.description:<22}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        total = bar.add_task("all runs", total=len(plan.methods) * len(plan.seeds))
        tasks = {m.name: bar.add_task(m.name, total=len(plan.seeds)) for m in plan.methods}

        def progress(event: str, method: str, seed: int | None) -> None:
            if event in ("done", "skipped"):
                bar.advance(tasks[method])
                bar.advance(total)

        results = run_plan(
            plan,
            data,
            cfg.runs,
            env,
            force=cfg.force,
            logger=cfg.logger,
            progress=progress,
            note=lambda s: console.print(f"note: {s}", highlight=False),
            initial=initial,
            save_states=states,
            command=train_command(cfg, settings=True),
        )
    console.print(summary_table(results, data.name))
    console.print(f"runs written under {cfg.runs / data.name}")
    return results


def summary_table(results: list[dict], scenario: str) -> Table:
    """Per method: seeds, mean test Brier and ACC, seconds per run, runs trained now."""
    table = Table(title=f"{scenario}: test split, mean over seeds", title_justify="left")
    for col in ("method", "display", "seeds", "Brier", "ACC", "s/run", "new"):
        table.add_column(col, justify="left" if col in ("method", "display") else "right")
    by: dict[str, list[dict]] = {}
    for r in results:
        by.setdefault(r["method"], []).append(r)
    for method, rs in by.items():
        walls = [r["wall_time_s"] for r in rs if r["status"] == "done"]
        table.add_row(
            method,
            rs[0].get("display_name", method),
            str(len(rs)),
            f"{sum(r['test_brier'] for r in rs) / len(rs):.4f}",
            f"{100 * sum(r['test_acc'] for r in rs) / len(rs):.2f}",
            f"{sum(walls) / len(walls):.2f}" if walls else "-",
            str(len(walls)),
        )
    return table
