"""Training numbers pinned to TRAIN_SCHEMA: every method trained on one tiny fixed scenario, digested.

    python -m walla.train.golden            # compare with train/golden.json (tests/train/test_golden.py)
    python -m walla.train.golden --write    # after bumping TRAIN_SCHEMA (train/runs.py): store the new digests

A run key's `schema` (TRAIN_SCHEMA) says which training code produced a run's numbers; runs of another
schema are stale. So the constant must change whenever the numbers do, and a test holds it to that:
walla train's own recipe (train/run.py run_plan) trains every registered method for one seed on a 60-question
synthetic scenario (CPU, 32-true, one thread, a few epochs: seconds), reads back what it wrote
(predictions.parquet: weights, aggregate, wagers, payouts, every extra column) and digests each method's
numbers. train/golden.json stores the digests with the schema they were written under. If a digest moves
and TRAIN_SCHEMA did not, the check fails and says to bump it; `--write` refuses to store moved digests
under an unchanged schema, so the file cannot be regenerated around the rule. Changing what this module
trains (its scenario, HPARAMS: `setup_id`) is not a change of the training code: its digests are simply
regenerated (that edit is to golden.py itself, in plain sight of review).

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
With one thread, on one CPU build, the sketches repeat bit for bit.
"""

from __future__ import annotations

import hashlib
import json
import math
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
import typer
from walla.manifests.scenario import Scenario, ScenarioSpec
from walla.store.atomic import write_json
from walla.store.scenario_data import ScenarioData
from walla.store.schema import VARIANT_CODE
from walla.train.engine import TrainEnv
from walla.train.methods import ALL
from walla.train.plan import Overrides, TrainPlan, build_plan
from walla.train.run import run_plan
from walla.train.runs import PREDICTIONS, TRAIN_SCHEMA, list_matrix, list_run_dirs

GOLDEN_FILE = Path(__file__).with_name("golden.json")
WRITE_COMMAND = "python -m walla.train.golden --write"
DIMS = 8  # projections per digest
TOLERANCE = 2e-6  # of the values' RMS: other CPUs' float noise passes, a change of the numbers does not
SEED = 18
HASHING = {"encoder": "hashing", "pooling": "none", "encoder_lr_mult": 0.0, "lr": 5.0e-2, "epochs": 4}
HPARAMS = {  # the demo preset's shape (manifests/scenarios/_demo.yaml), sized for seconds
    "walla": {
        "lr": 5.0e-3,
        "epochs": 4,
        "patience": 300,
        "batch_size": 8,
        "hidden": [16, 8],
        "projection_dim": None,
        "standardize": True,
        "calibration": {"hidden": [8], "epochs": 4, "batch_size": 8, "min_rows": 5},
    },
    "stacked-gen": {"lr": 1.0e-3, "epochs": 4, "batch_size": 8, "hidden": [16, 8], "projection_dim": None},
    "route-llm": {**HASHING, "batch_size": 8},
    "router-dc": {**HASHING, "batch_size": 8},
    "nirt-router": {**HASHING, "batch_size": 8, "agent_dim": 16, "hidden_dim": 16},
}


def golden_scenario() -> ScenarioData:
    """60 questions (48 train / 6 val / 6 test), 3 agents of hidden sizes 8, 8 and 12, 3 options (every
    fifth question has 2), one agent per question holding the context: fixed by its seed alone."""
    rng = np.random.default_rng(20261126)
    n, m, k, dims = 60, 3, 3, (8, 8, 12)
    split = np.array(["train"] * 48 + ["val"] * 6 + ["test"] * 6)
    n_options = np.where(np.arange(n) % 5 == 0, 2, 3)
    mask = np.arange(k)[None, :] < n_options[:, None]  # [N, K]
    label = (rng.random(n) * n_options).astype(np.int64)  # [N]
    informed = rng.integers(0, m, size=n)  # [N] the slot holding the context
    logits = rng.normal(0.0, 1.0, size=(n, m, k))  # [N, M, K]
    logits[np.arange(n), informed, label] += 3.0
    logits = np.where(mask[:, None, :], logits, -np.inf)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs = (probs / probs.sum(-1, keepdims=True)).astype(np.float32)  # [N, M, K]
    is_inf = np.arange(m)[None, :] == informed[:, None]  # [N, M]
    hidden = [
        (rng.normal(size=(n, h)) + np.where(is_inf[:, [i]], 1.0, -1.0) * rng.normal(size=h)).astype(
            np.float16
        )
        for i, h in enumerate(dims)
    ]
    question = [f"Golden question {j}: which of {n_options[j]} options?" for j in range(n)]
    return ScenarioData(
        name="golden",
        dataset="golden",
        agents=["g0", "g1", "g2"],
        question_id=np.array([f"q{j:03d}" for j in range(n)]),
        split=split,
        question=question,
        prompts=[
            [f"Context {j}. {question[j]}" if is_inf[j, i] else question[j] for j in range(n)]
            for i in range(m)
        ],
        n_options=n_options.astype(np.int64),
        option_mask=mask,
        probs=probs,
        label=label,
        target=np.eye(k, dtype=np.float32)[label],
        soft_target=False,
        prompt_nll=(2.0 - 0.3 * is_inf + rng.normal(0.0, 0.2, size=(n, m))).astype(np.float32),
        variant=np.where(is_inf, VARIANT_CODE["relevant"], VARIANT_CODE["none"]).astype(np.int8),
        hidden=hidden,
        fingerprints={f"g{i}/mixed": f"golden{i:010d}" for i in range(m)},
        meta={"context_rule": "one_relevant"},
    )


def golden_plan() -> TrainPlan:
    """Every registered method (`methods: all`), seed 18, HPARAMS."""
    spec = ScenarioSpec(name="golden", dataset="golden", agents=("g0", "g1", "g2"), description="golden")
    problems: list[str] = []
    train = {"methods": ALL, "seeds": [SEED], "hparams": HPARAMS}
    plan = build_plan({"train": train}, Path("golden.yaml"), Scenario(spec, {}, {}), Overrides(), problems)
    if problems or plan is None:
        raise ValueError(f"golden plan: {'; '.join(problems)}")
    return plan


def sketch(values: np.ndarray) -> dict:
    """{"n", "rms", "proj"}: DIMS fixed Gaussian projections of `values` / sqrt(n) (module docstring)."""
    v = np.asarray(values, dtype=np.float64).ravel()
    r = np.random.default_rng([SEED, v.size]).standard_normal((DIMS, v.size))  # [DIMS, n]
    return {
        "n": int(v.size),
        "rms": float(np.sqrt(np.mean(v**2))),
        "proj": [float(x) for x in r @ v / math.sqrt(v.size)],
    }


def compute() -> dict[str, dict]:
    """method -> digest of its golden run, trained now: {"columns": [...], "n", "rms", "proj"}."""
    with tempfile.TemporaryDirectory(prefix="walla-golden-") as tmp:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # one reduction order, whatever the machine's core count
        try:
            env = TrainEnv(device="cpu", precision="32-true")
            run_plan(golden_plan(), golden_scenario(), tmp, env, note=lambda s: None)
        finally:
            torch.set_num_threads(threads)
        out = {}
        for d in list_run_dirs(tmp, "golden"):
            pred = pq.read_table(d.path / PREDICTIONS)  # every row of every split, as walla train wrote it
            where = str(d.path / PREDICTIONS)
            cols = {
                c: list_matrix(pred, c, None, where)
                for c in pred.column_names
                if c not in ("question_id", "split")
            }
            names = sorted(c for c, v in cols.items() if v is not None)  # all-null extras: not computed
            out[d.method] = {"columns": names, **sketch(np.concatenate([cols[c].ravel() for c in names]))}
    return dict(sorted(out.items()))


def changes(stored: dict, current: dict[str, dict]) -> list[str]:
    """The methods whose digest moved beyond TOLERANCE (or whose columns or sizes changed), one line each."""
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
        if moved > TOLERANCE * max(old["rms"], 1e-12):
            out.append(
                f"{method}: moved by {moved / max(old['rms'], 1e-12):.2e} of its RMS (tolerance {TOLERANCE:g})"
            )
    return out


def setup_id() -> str:
    """What this module trains (the scenario's arrays and texts, HPARAMS, seed, DIMS), hashed: digests of
    another setup are regenerated, not read as a change of the training code."""
    data = golden_scenario()
    arrays = (data.probs, data.label, data.option_mask, data.prompt_nll, data.variant, *data.hidden)
    text = [data.question, data.prompts, list(data.split), HPARAMS, SEED, DIMS]
    h = hashlib.sha256(json.dumps(text, sort_keys=True).encode())
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def check(
    stored: dict, current: dict[str, dict], schema: int = TRAIN_SCHEMA, setup: str | None = None
) -> list[str]:
    """Problems of the training code against its golden digests, each a line saying what to do ([]: none).
    `setup`: the golden setup of `current` (None: setup_id())."""
    if stored.get("schema") != schema:
        return [
            f"{GOLDEN_FILE.name} holds digests of TRAIN_SCHEMA {stored.get('schema')!r}, the code is schema "
            f"{schema}: regenerate them: {WRITE_COMMAND}"
        ]
    if stored.get("setup") != (setup or setup_id()):
        return [
            f"{GOLDEN_FILE.name} holds digests of another golden setup (train/golden.py): {WRITE_COMMAND}"
        ]
    moved = changes(stored, current)
    out = []
    if moved:
        out.append(
            f"the training numbers changed but TRAIN_SCHEMA did not (still {schema}): {'; '.join(moved)}. "
            f"Bump TRAIN_SCHEMA in train/runs.py (runs trained before this change must count as stale), then "
            f"regenerate the digests: {WRITE_COMMAND}"
        )
    missing = sorted(set(current) - set(stored.get("methods") or {}))
    gone = sorted(set(stored.get("methods") or {}) - set(current))
    if missing or gone:
        out.append(
            f"golden digests missing for {missing or 'none'}, stored for unregistered {gone or 'none'}: "
            f"{WRITE_COMMAND}"
        )
    return out


def read_golden(path: Path = GOLDEN_FILE) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}


def write(
    current: dict[str, dict], path: Path = GOLDEN_FILE, schema: int = TRAIN_SCHEMA, setup: str | None = None
) -> None:
    """Store `current` as the digests of `schema` and `setup` (None: setup_id()); refused when digests of
    the same schema and setup moved.

    Raises:
        ValueError: the schema and setup are unchanged and a stored digest moved (bump TRAIN_SCHEMA first).
    """
    stored = read_golden(path)
    setup = setup or setup_id()
    same = stored.get("schema") == schema and stored.get("setup") == setup
    if same and (moved := changes(stored, current)):
        raise ValueError(
            f"{path}: digests of TRAIN_SCHEMA {schema} moved ({'; '.join(moved)}); not overwritten: bump "
            f"TRAIN_SCHEMA in train/runs.py first, then rerun {WRITE_COMMAND}"
        )
    write_json(path, {"schema": schema, "setup": setup, "methods": current})


def main(
    write_digests: bool = typer.Option(
        False, "--write", help="store the digests (after bumping TRAIN_SCHEMA)"
    ),
) -> None:
    """Train the golden scenario and compare its digests with train/golden.json (or store them)."""
    current = compute()
    if write_digests:
        try:
            write(current)
        except ValueError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None
        typer.echo(f"wrote {GOLDEN_FILE}: {len(current)} methods, TRAIN_SCHEMA {TRAIN_SCHEMA}")
        return
    problems = check(read_golden(), current)
    for line in problems:
        typer.echo(f"error: {line}", err=True)
    if problems:
        raise typer.Exit(1)
    typer.echo(f"{GOLDEN_FILE}: {len(current)} methods match TRAIN_SCHEMA {TRAIN_SCHEMA}")


if __name__ == "__main__":
    typer.run(main)
