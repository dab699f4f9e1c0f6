"""Where training runs live on disk: file and directory names, and listing them.

The format has ONE writer (walla train, train/runs/_writer.py) and ONE reader (walla eval and the market,
train/runs/_reader.py); a run's identity is train/runs/_identity.py, whether it still counts train/runs/_lineage.py.

    <runs>/<scenario>/scenario.parquet   one row per question: question_id, split, label, target [K],
                                          option_mask [K], agent_probs [M*K] (agent-major), variant [M]
    <runs>/<scenario>/scenario.json      agents, dataset, soft_target, K, M, N, splits, fingerprints
                                          (feature sets used: "<model>/<variant>" -> fp), inputs_id,
                                          methods and seeds ever planned, the resolved spec, the
                                          `walla train` command that builds it (train_command)
    <runs>/<scenario>/.lock              one walla train per runs dir and scenario at a time
    <runs>/<scenario>/<method>/<key-id>/key.json   the run key of the runs below, and the seeds planned
    <runs>/<scenario>/<method>/<key-id>/seed=<s>/
        predictions.parquet  question_id, split, weights [M], agg_probs [K], wagers/payouts/advantage/
                             pred_score/pred_baseline [M] | null, agent_probs [M*K] | null (methods that
                             change agents' probs, e.g. calibration), method-specific extra list columns
        logs/metrics.csv     the training curve, one row per training batch: step, epoch, n_seen, metric
                             columns (Lightning's CSVLogger, train/loggers.py; absent for methods without
                             training); logs/tensorboard/ with --logger tensorboard
        state.pt             the trained state, only for the methods of --save-states (train/run.py): WALLA
                             heads continued by --add-agent and played by walla market
        run.json             method, display_name, group, seed, run_key, key_id, config (resolved),
                             inputs_id, fingerprints, device, precision, wall_time_s, test_brier, test_acc,
                             continued (a joined run: the base run's scenario, key_id, seed, inputs_id);
                             written LAST: marks the run complete

Directories `<method>/seed=<s>/` directly under the scenario are the layout before run keys: listed
(key_id None) so that they are reported stale, never read as current runs.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

SCENARIO_TABLE, SCENARIO_META, LOCK = "scenario.parquet", "scenario.json", ".lock"
PREDICTIONS, TRAIN_LOG, STATE, RUN_META = "predictions.parquet", "logs/metrics.csv", "state.pt", "run.json"
KEY_FILE = "key.json"
METHOD_GROUPS = ("individual", "learning_free", "learning_based", "walla")
EXTRAS = ("wagers", "payouts", "advantage", "pred_score", "pred_baseline")  # optional [M] columns
SEED_DIR = re.compile(r"^seed=(-?\d+)$")
KEY_DIR = re.compile(r"^[0-9a-f]{10}$")  # key_id(): 10 hex digits


class RunFormatError(ValueError):  # a run or scenario file that cannot be read as this format (names it)
    pass


def scenario_dir(runs: str | Path, scenario: str) -> Path:
    return Path(runs) / scenario


def key_dir(runs: str | Path, scenario: str, method: str, key_id: str) -> Path:
    return scenario_dir(runs, scenario) / method / key_id


def run_dir(runs: str | Path, scenario: str, method: str, key_id: str, seed: int) -> Path:
    return key_dir(runs, scenario, method, key_id) / f"seed={int(seed)}"


def is_complete(path: str | Path) -> bool:  # run.json is written last
    return (Path(path) / RUN_META).exists()


@dataclasses.dataclass(frozen=True)
class RunDir:
    """One run directory found on disk (complete or not)."""

    method: str
    key_id: str | None  # None: the layout before run keys (<method>/seed=<s>/), always stale
    seed: int
    path: Path


def _seed_dirs(parent: Path) -> list[tuple[int, Path]]:
    found = ((SEED_DIR.match(p.name), p) for p in sorted(parent.iterdir()) if p.is_dir())
    return [(int(m.group(1)), p) for m, p in found if m is not None]


def list_run_dirs(runs: str | Path, scenario: str) -> list[RunDir]:
    """Every run directory under <runs>/<scenario>/, by method, key id and seed (sorted by path)."""
    d = scenario_dir(runs, scenario)
    if not d.is_dir():
        return []
    out: list[RunDir] = []
    for mdir in sorted(p for p in d.iterdir() if p.is_dir() and not p.name.startswith(".")):
        out += [RunDir(mdir.name, None, seed, p) for seed, p in _seed_dirs(mdir)]
        for kdir in sorted(p for p in mdir.iterdir() if p.is_dir() and KEY_DIR.match(p.name)):
            out += [RunDir(mdir.name, kdir.name, seed, p) for seed, p in _seed_dirs(kdir)]
    return out


def list_scenarios(runs: str | Path) -> list[str]:
    root = Path(runs)  # the scenario directories: those holding scenario.json
    if not root.is_dir():
        raise RunFormatError(f"runs directory {root} does not exist (run walla train first, or pass --runs)")
    return sorted(p.name for p in root.iterdir() if (p / SCENARIO_META).exists())
