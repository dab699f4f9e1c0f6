"""Which trained runs a replay uses: the seeds of ONE run key of one method, named by the user when needed.

    choice = choose_runs(Path("runs"), "demo-homo-facts", "walla-i")            # the method's only key
    choice = choose_runs(Path("runs"), "demo-homo-facts", "walla-i", key="1a2b3c4d5e")
    choice = choose_runs(run=Path("runs/demo-homo-facts/walla-i/1a2b3c4d5e/seed=18"))

A scenario can hold several run keys (configurations) of one method, each in its own directory
runs/<scenario>/<method>/<key-id>/seed=<s>/ (train/runs/_layout.py). Replay never picks one by age: `run` (a key
directory or one of its seed directories) or `key` (a key id, or a unique prefix of one) names it, the
method's only key is taken when there is one, and with several RunChoiceError lists them on one line.

The runs are those walla eval counts (evaluate/load.py load_scenario_runs: complete, with a run key, of
the scenario's current inputs and walla train schema, and a joined run only while the base run it
continued is current: train/runs/_lineage.py stale_run_reason): a replay, and `walla serve`, play the same runs
the tables report, never a stale, pre-run-key or orphaned joined one. `choose_runs` is the function every
consumer of "the current runs of a method's key" calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from walla.evaluate.load import Problem, load_scenario_runs
from walla.train.runs._layout import KEY_DIR, SEED_DIR, RunFormatError
from walla.train.runs._reader import RunRecord, ScenarioTable

DEFAULT_METHOD = "walla-i"


class RunChoiceError(RunFormatError):
    """No run key, or not one: names the scenario, the method and what the user can pass (one line)."""


@dataclass
class RunChoice:
    runs: Path
    scenario: str
    method: str
    key_id: str
    label: str  # the table's row label of this key (names what differs when the method has several keys)
    table: ScenarioTable  # the scenario's test split
    seeds: dict[int, RunRecord]  # the chosen seeds, in order


@dataclass(frozen=True)
class RunPath:
    """A run directory named by the user, split into the parts of runs/<scenario>/<method>/<key-id>[/seed=<s>]."""

    runs: Path
    scenario: str
    method: str
    key_id: str
    seed: int | None


def parse_run_path(path: Path) -> RunPath:
    """The parts of a key directory or seed directory (RunChoiceError naming the expected shape)."""
    p = Path(path)
    if not p.is_dir():
        raise RunChoiceError(f"--run {path}: no such directory")
    seed = None
    match = SEED_DIR.match(p.name)
    if match:
        seed, p = int(match.group(1)), p.parent
    if not KEY_DIR.match(p.name) or len(p.parts) < 4:
        raise RunChoiceError(
            f"--run {path}: expected a run key directory runs/<scenario>/<method>/<key-id>"
            " (10 hex digits) or one of its seed=<s> directories"
        )
    return RunPath(p.parent.parent.parent, p.parent.parent.name, p.parent.name, p.name, seed)


def _keys(runs: dict[str, dict[int, RunRecord]], method: str) -> dict[str, dict[int, RunRecord]]:
    """key id -> seed -> run of `method`, from walla eval's rows (one row per run key)."""
    out: dict[str, dict[int, RunRecord]] = {}
    for by_seed in runs.values():
        first = next(iter(by_seed.values()))
        if first.method == method:
            out[first.path.parent.name] = by_seed
    return out


def _seed_text(seeds) -> str:
    return ",".join(str(s) for s in sorted(seeds))


def _listing(keys: dict[str, dict[int, RunRecord]]) -> str:
    return "; ".join(
        f"{kid} = {next(iter(g.values())).display} (seeds {_seed_text(g)})" for kid, g in keys.items()
    )


def _no_runs(where: str, method: str, runs: dict, problems: list[Problem]) -> RunChoiceError:
    """The error for a method without a counted run: why its directories do not count, or what exists."""
    mine = [p for p in problems if p.method == method]
    if mine:
        more = f" (and {len(mine) - 1} more)" if len(mine) > 1 else ""
        return RunChoiceError(f"{where}: no current {method} runs: {mine[0].line()}{more}")
    have = sorted({next(iter(g.values())).method for g in runs.values()})
    return RunChoiceError(
        f"{where}: no {method} runs (methods with runs: {', '.join(have) or 'none'}); run walla train first"
    )


def _pick_key(
    keys: dict[str, dict[int, RunRecord]], where: str, method: str, key: str | None, run_flag: bool = True
) -> str:
    if key is None:
        if len(keys) == 1:
            return next(iter(keys))
        flags = "--key KEY_ID or --run DIR" if run_flag else "--key KEY_ID"
        raise RunChoiceError(
            f"{where}: {method} has {len(keys)} run keys, name one with {flags}: " + _listing(keys)
        )
    found = [kid for kid in keys if kid.startswith(key)]
    if key in keys:
        return key
    if len(found) == 1:
        return found[0]
    what = "matches several" if found else "is not"
    raise RunChoiceError(f"{where}: --key {key} {what} a run key of {method}: {_listing(keys)}")


def choose_runs(
    runs: Path | None = None,
    scenario: str | None = None,
    method: str | None = None,
    key: str | None = None,
    run: Path | None = None,
    seeds: list[int] | None = None,
    run_flag: bool = True,
) -> RunChoice:
    """The runs to replay (module docstring). `method`: None for walla-i (or the --run's); `seeds`: None for
    every counted seed of the chosen key; `run_flag`: whether the command has --run (walla serve has not), so
    an error suggests only flags the caller has.

    Raises:
        RunChoiceError: no counted run of the method, several keys and none named, an unknown key, a seed
            the key has no run for, or a --run that contradicts --scenario / --method / --key.
        RunFormatError: the scenario's own files cannot be read.
    """
    if run is not None:
        named = parse_run_path(run)
        for flag, given, derived in (
            ("--scenario", scenario, named.scenario),
            ("--method", method, named.method),
            ("--key", key, named.key_id),
        ):
            if given is not None and given != derived:
                raise RunChoiceError(f"--run {run} is {flag} {derived}, not {given}")
        runs, scenario, method, key = named.runs, named.scenario, named.method, named.key_id
        if named.seed is not None:
            if seeds is not None and seeds != [named.seed]:
                raise RunChoiceError(
                    f"--run {run} is seed {named.seed}; --seeds {_seed_text(seeds)} contradicts it"
                )
            seeds = [named.seed]
    if runs is None or scenario is None:
        raise RunChoiceError("name the runs: --scenario (and --runs), or --run DIR")
    method = method or DEFAULT_METHOD
    where = f"{runs}/{scenario}"
    found = load_scenario_runs(Path(runs), scenario)
    keys = _keys(found.runs, method)
    if not keys:
        raise _no_runs(where, method, found.runs, found.problems)
    kid = _pick_key(keys, where, method, key, run_flag)
    by_seed = keys[kid]
    chosen = sorted(by_seed) if seeds is None else list(seeds)
    missing = [s for s in chosen if s not in by_seed]
    if missing:
        raise RunChoiceError(
            f"{where}/{method}/{kid}: no current run for seed(s) {_seed_text(missing)} (have {_seed_text(by_seed)})"
        )
    label = next(iter(by_seed.values())).display
    return RunChoice(
        Path(runs), scenario, method, kid, label, found.scenario, {s: by_seed[s] for s in chosen}
    )
