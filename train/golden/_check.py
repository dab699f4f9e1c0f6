"""Training numbers pinned to TRAIN_SCHEMA: every method trained on one tiny fixed scenario, digested.

    python -m walla.train.golden            # compare with train/golden/golden.json (tests/train/test_golden.py)
    python -m walla.train.golden --write    # after bumping TRAIN_SCHEMA (train/runs/_identity.py): store the new digests
    python -m walla.train.golden --device cuda [--write]   # the same on a CUDA device: train/golden/golden_cuda.json

A run key's `schema` (TRAIN_SCHEMA) says which training code produced a run's numbers; runs of another
schema are stale. So the constant must change whenever the numbers do, and a test holds it to that:
walla train's own recipe (train/run.py run_plan) trains every registered method for one seed on a 60-question
synthetic scenario (CPU, 32-true, one thread, a few epochs: seconds), reads back what it wrote
(predictions.parquet: weights, aggregate, wagers, payouts, every extra column) and digests each method's
numbers (train/golden/_setup.py holds that scenario and HPARAMS). Every other numeric path a user can
select is a variant of that run (PATHS), digested as
"<method>@<path>": bf16-mixed precision, the paper preset's projection (folded into the first layer by
StackedHeads.predict), seeds batched in one fit, early stopping that fires (its runs' logged batches
digested too: where each stopped), walla's default standardize: false on float32 features, plan-level
--calibrated, and a continued fit (an agent joining, train/join.py). train/golden/golden.json stores the digests with the schema they
were written under. If a digest moves
and TRAIN_SCHEMA did not, the check fails and says to bump it; `--write` refuses to store moved digests
under an unchanged schema, so the file cannot be regenerated around the rule. Changing what is trained
(golden/setup.py: its scenario, HPARAMS, PATHS; `setup_id`) is not a change of the training code: its
digests are simply regenerated (that edit is to golden/setup.py itself, in plain sight of review).

The digest is a sketch, not a hash: DIMS fixed Gaussian projections of a method's values (float32 as
stored), divided by sqrt(n), plus their RMS, compared with a tolerance of TOLERANCE x RMS. A projection moves
by about the RMS of the change in the values (a random direction sees every coordinate), so float noise
passes and a change of the training numbers does not, whichever values it touches. Measured on this
machine (2026-11-26) by forcing other CPU kernels (ATEN_CPU_CAPABILITY=default|avx2, MKL_CBWR=AVX2|
COMPATIBLE|SSE4_2: what another CPU would run): 1378 of the 7920 values change (up to 4.4e-6 relative),
and the sketches move by at most 2.4e-7 of the RMS -- while a hash of values rounded to 5 (6) significant
digits would have failed for 4 (9) of the 14 methods: a value within the noise of a rounding boundary
flips its digit. Real changes move them by 4e-5 (the routers' weight decay 0.01 -> 0.02) to 1e-3 (Adam's
beta2 0.999 -> 0.99): TOLERANCE sits between, 8x above that noise and 20x below the smallest change seen.
With one thread, on one CPU build, the sketches repeat bit for bit. The PATHS digests, measured the same
way (2026-11-28, ATEN_CPU_CAPABILITY=default|avx2, MKL_CBWR=COMPATIBLE; ONEDNN_MAX_CPU_ISA=AVX2 moved
nothing), move by at most 1.9e-7 of their RMS, bf16-mixed included; forcing bf16-true where bf16-mixed is
asked moves walla-i@bf16-mixed by 6.1e-3, and dropping the projection bias in StackedHeads.predict moves
walla-i@projection by 1.0e-1 (tests/train/test_golden.py), neither seen by the golden run alone.
CUDA runs draw their init on the device, so their numbers are pinned apart, in train/golden/golden_cuda.json
(a `gpu`-marked test), within CUDA_TOLERANCE.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
import typer
from walla.store.atomic import write_json
from walla.train.engine import TrainEnv
from walla.train.golden._setup import (
    HPARAMS,
    JOIN_EPOCHS,
    PATHS,
    SEED,
    golden_plan,
    golden_scenario,
    with_agents,
)
from walla.train.join import initial_params, joined_plan
from walla.train.run import run_plan
from walla.train.runs import PREDICTIONS, TRAIN_LOG, TRAIN_SCHEMA, list_matrix, list_run_dirs

GOLDEN_FILE = Path(__file__).with_name("golden.json")
GOLDEN_CUDA_FILE = Path(__file__).with_name("golden_cuda.json")  # the same runs on a CUDA device
WRITE_COMMAND = "python -m walla.train.golden --write"
DIMS = 8  # projections per digest
TOLERANCE = 2e-6  # of the values' RMS: other CPUs' float noise passes, a change of the numbers does not
# CUDA runs draw their init on the device (engine.init_generator): other numbers than the CPU's, pinned in
# GOLDEN_CUDA_FILE. Not measured yet (no GPU where this was written): cuBLAS picks its kernels by GPU model
# and library version, so 10x the CPU tolerance, still below the smallest real change seen (4e-5).
CUDA_TOLERANCE = 2e-5


def sketch(values: np.ndarray) -> dict:
    """{"n", "rms", "proj"}: DIMS fixed Gaussian projections of `values` / sqrt(n) (module docstring)."""
    v = np.asarray(values, dtype=np.float64).ravel()
    r = np.random.default_rng([SEED, v.size]).standard_normal((DIMS, v.size))  # [DIMS, n]
    return {
        "n": int(v.size),
        "rms": float(np.sqrt(np.mean(v**2))),
        "proj": [float(x) for x in r @ v / math.sqrt(v.size)],
    }


def _digests(runs: str | Path, scenario: str, steps: bool = False) -> dict[str, dict]:
    """method -> digest of its runs of `scenario` under `runs` (seeds in order, every column of
    predictions.parquet as walla-train wrote it, every row of every split; with `steps`, each run's number
    of logged training batches too, as column "logged_steps")."""
    values: dict[str, list] = {}
    names: dict[str, list[str]] = {}
    for d in list_run_dirs(runs, scenario):
        pred = pq.read_table(d.path / PREDICTIONS)
        where = str(d.path / PREDICTIONS)
        cols = {
            c: list_matrix(pred, c, None, where)
            for c in pred.column_names
            if c not in ("question_id", "split")
        }
        names[d.method] = sorted(c for c, v in cols.items() if v is not None)  # all-null extras: not computed
        values.setdefault(d.method, []).extend(cols[c].ravel() for c in names[d.method])
        if steps:
            names[d.method].append("logged_steps")
            values[d.method].append(np.array([_logged_steps(d.path)], dtype=np.float64))
    return {m: {"columns": names[m], **sketch(np.concatenate(values[m]))} for m in sorted(values)}


def _one_thread(fn):
    """fn() with torch on one thread: one reduction order, whatever the machine's core count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn()
    finally:
        torch.set_num_threads(threads)


def compute(paths=None, device: str = "cpu") -> dict[str, dict]:
    """method -> digest of its golden run, and "<method>@<path>" -> digest of every PATHS variant (or those
    of `paths`), trained now on `device`: {"columns": [...], "n", "rms", "proj"} each."""
    with tempfile.TemporaryDirectory(prefix="walla-golden-") as tmp:
        env = TrainEnv(device=device, precision="32-true")
        _one_thread(lambda: run_plan(golden_plan(), golden_scenario(), tmp, env, note=lambda s: None))
        out = _digests(tmp, "golden")
    for path, digests in compute_paths(paths, device).items():
        out.update({f"{method}@{path}": d for method, d in digests.items()})
    return dict(sorted(out.items()))


def train_path(name: str, runs: Path, device: str = "cpu") -> str:
    """Train PATHS[name] under `runs` (on `device`); returns the scenario its digested runs are of."""
    spec = PATHS[name]
    env = TrainEnv(device=device, precision=spec.get("precision", "32-true"))
    plan = golden_plan(
        spec["methods"], spec.get("seeds", (SEED,)), spec.get("hparams"), spec.get("calibrated", False)
    )
    data = golden_scenario(spec.get("hidden", "float16"))
    if not spec.get("join"):
        run_plan(plan, data, runs, env, note=lambda s: None)
        return data.name
    base_plan = golden_plan(spec["methods"], agents=("g0", "g1"))
    base = with_agents(data, [0, 1], "golden")
    run_plan(base_plan, base, runs, env, note=lambda s: None, save_states=set(spec["methods"]))
    joined, origin = joined_plan(base_plan, ["g2"], [], epochs=JOIN_EPOCHS)
    data = dataclasses.replace(data, name=joined.spec.name)
    initial = initial_params(base_plan, joined, origin, base, data, runs, env)
    run_plan(joined, data, runs, env, note=lambda s: None, initial=initial)
    return data.name


def compute_paths(names=None, device: str = "cpu") -> dict[str, dict[str, dict]]:
    """path -> method -> digest of PATHS (all, or `names`), trained now on `device`. The early-stopping
    path must stop early (else it digests nothing the golden run does not): checked here."""
    out = {}
    for name in names or PATHS:
        with tempfile.TemporaryDirectory(prefix=f"walla-golden-{name}-") as tmp:
            scenario = _one_thread(lambda name=name, tmp=tmp: train_path(name, Path(tmp), device))
            out[name] = _digests(tmp, scenario, steps=PATHS[name].get("steps", False))
            if name == "early-stopping":
                _check_stopped(Path(tmp), scenario)
    return out


def _logged_steps(run: Path) -> int:
    """The training batches a run logged (logs/metrics.csv rows): where its early stopping stopped it."""
    return len((run / TRAIN_LOG).read_text().splitlines()) - 1


def _check_stopped(runs: Path, scenario: str) -> None:
    for d in list_run_dirs(runs, scenario):
        steps = _logged_steps(d.path)
        epochs = PATHS["early-stopping"]["hparams"]["walla"]["epochs"]
        full = epochs * math.ceil(48 / HPARAMS["walla"]["batch_size"])  # 48 training rows
        if steps >= full:
            raise AssertionError(
                f"golden path early-stopping: {d.path} trained all {full} batches, never stopped"
            )


def changes(stored: dict, current: dict[str, dict], tolerance: float = TOLERANCE) -> list[str]:
    """The digests that moved beyond their tolerance (or whose columns or sizes changed), one line each."""
    out = []
    for method, now in current.items():
        old = (stored.get("methods") or {}).get(method)
        if old is None:
            continue
        if old["columns"] != now["columns"] or old["n"] != now["n"]:
            out.append(
                f"{method}: columns {old['columns']} x {old['n']} values -> {now['columns']} x {now['n']}"
            )
            continue
        moved = max(
            abs(a - b) for a, b in zip([old["rms"], *old["proj"]], [now["rms"], *now["proj"]], strict=True)
        )
        if moved > tolerance * max(old["rms"], 1e-12):
            out.append(
                f"{method}: moved by {moved / max(old['rms'], 1e-12):.2e} of its RMS (tolerance {tolerance:g})"
            )
    return out


def setup_id() -> str:
    """What this module trains (the scenario's arrays and texts, HPARAMS, seed, DIMS, PATHS), hashed: digests
    of another setup are regenerated, not read as a change of the training code."""
    data = golden_scenario()
    arrays = (data.probs, data.label, data.option_mask, data.prompt_nll, data.variant, *data.hidden)
    text = [data.question, data.prompts, list(data.split), HPARAMS, SEED, DIMS]
    text += [PATHS, JOIN_EPOCHS]
    h = hashlib.sha256(json.dumps(text, sort_keys=True).encode())
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def golden_file(device: str = "cpu") -> tuple[Path, float, str]:
    """(digest file, tolerance, the command that writes it) of the golden runs on `device` (cpu | cuda)."""
    if device == "cuda":
        return GOLDEN_CUDA_FILE, CUDA_TOLERANCE, f"{WRITE_COMMAND} --device cuda (on a CUDA machine)"
    return GOLDEN_FILE, TOLERANCE, WRITE_COMMAND


def check(
    stored: dict,
    current: dict[str, dict],
    schema: int = TRAIN_SCHEMA,
    setup: str | None = None,
    device: str = "cpu",
) -> list[str]:
    """Problems of the training code against its golden digests, each a line saying what to do ([]: none).
    `setup`: the golden setup of `current` (None: setup_id()); `device`: where `current` was trained."""
    file, tolerance, command = golden_file(device)
    if stored.get("schema") != schema:
        return [
            f"{file.name} holds digests of TRAIN_SCHEMA {stored.get('schema')!r}, the code is schema "
            f"{schema}: regenerate them: {command}"
        ]
    if stored.get("setup") != (setup or setup_id()):
        return [f"{file.name} holds digests of another golden setup (train/golden/_check.py): {command}"]
    moved = changes(stored, current, tolerance)
    out = []
    if moved:
        out.append(
            f"the training numbers changed but TRAIN_SCHEMA did not (still {schema}): {'; '.join(moved)}. "
            f"Bump TRAIN_SCHEMA in train/runs/_identity.py (runs trained before this change must count as stale), then "
            f"regenerate the digests: {command}"
        )
    missing = sorted(set(current) - set(stored.get("methods") or {}))
    gone = sorted(set(stored.get("methods") or {}) - set(current))
    if missing or gone:
        out.append(
            f"golden digests missing for {missing or 'none'}, stored for unregistered {gone or 'none'}: "
            f"{command}"
        )
    return out


def read_golden(path: Path = GOLDEN_FILE) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}


def write(
    current: dict[str, dict],
    path: Path = GOLDEN_FILE,
    schema: int = TRAIN_SCHEMA,
    setup: str | None = None,
    tolerance: float = TOLERANCE,
) -> None:
    """Store `current` as the digests of `schema` and `setup` (None: setup_id()); refused when digests of
    the same schema and setup moved (beyond `tolerance`).

    Raises:
        ValueError: the schema and setup are unchanged and a stored digest moved (bump TRAIN_SCHEMA first).
    """
    stored = read_golden(path)
    setup = setup or setup_id()
    same = stored.get("schema") == schema and stored.get("setup") == setup
    if same and (moved := changes(stored, current, tolerance)):
        raise ValueError(
            f"{path}: digests of TRAIN_SCHEMA {schema} moved ({'; '.join(moved)}); not overwritten: bump "
            f"TRAIN_SCHEMA in train/runs/_identity.py first, then rerun {WRITE_COMMAND}"
        )
    write_json(path, {"schema": schema, "setup": setup, "methods": current})


def main(
    write_digests: bool = typer.Option(
        False, "--write", help="store the digests (after bumping TRAIN_SCHEMA)"
    ),
    device: str = typer.Option("cpu", "--device", help="cpu | cuda: the golden runs of that device"),
) -> None:
    """Train the golden scenario and compare its digests with train/golden/golden.json (or store them)."""
    if device not in ("cpu", "cuda"):
        typer.echo(f"error: --device {device!r}: expected cpu or cuda", err=True)
        raise typer.Exit(2)
    if device == "cuda" and not torch.cuda.is_available():
        typer.echo("error: --device cuda: torch.cuda.is_available() is False on this machine", err=True)
        raise typer.Exit(2)
    file, tolerance, _ = golden_file(device)
    current = compute(device=device)
    if write_digests:
        try:
            write(current, file, tolerance=tolerance)
        except ValueError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None
        typer.echo(f"wrote {file}: {len(current)} digests, TRAIN_SCHEMA {TRAIN_SCHEMA}")
        return
    problems = check(read_golden(file), current, device=device)
    for line in problems:
        typer.echo(f"error: {line}", err=True)
    if problems:
        raise typer.Exit(1)
    paths = sorted({name.partition("@")[2] for name in current} - {""})
    methods = sum("@" not in name for name in current)
    typer.echo(
        f"{file}: {methods} methods and {len(current) - methods} digests of {len(paths)} paths "
        f"({', '.join(paths)}) match TRAIN_SCHEMA {TRAIN_SCHEMA}"
    )


if __name__ == "__main__":
    typer.run(main)
