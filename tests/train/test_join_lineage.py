"""A joined run counts only while the base run it continued is the current run of its key (issue 37,
finding 2), checked wherever a run is read: walla eval (evaluate/load.py), the market's runs
(train/runs/_choice.py choose_runs: replays, `walla serve`) and its heads (train/runs/_lineage.py
read_current_run_meta). And every join refusal names a `walla train` command that works.

The issue's sequence, through the real commands on dummy-extracted feature sets:

    walla train --scenario hetero --models smollm2-135m,gemma3-270m ... --save-states walla-i  # the base
    walla train ... --seed-list 18 --add-agent smollm2-135m --drop-agent gemma3-270m --save-states walla-i
    (gemma3 re-extracted: other features) walla train ... (the base's plain command: same key id, retrained)
    walla train ... --seed-list 19 --add-agent smollm2-135m --drop-agent gemma3-270m          # join seed 19

Seed 18 continued the old base: it must not be averaged with seed 19 into one WALLA I row. Every fix a
message prints (walla eval's, a market head's, the join's) is run as printed, to its end (issue 47, item 3).
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner
from walla.evaluate.load import load_scenario_runs
from walla.extract.cli import app as extract_app
from walla.market.head import AgentHead, HeadError
from walla.store.cli import app as store_app
from walla.store.listing import list_feature_sets
from walla.train import cli as train_cli
from walla.train.runs import RunChoiceError, RunFormatError, choose_runs, read_current_run_meta, read_run_meta

runner = CliRunner()
BASE = "hetero-facts"
JOINED = "hetero-facts+smollm2-135m-gemma3-270m"
JOIN = ["--add-agent", "smollm2-135m", "--drop-agent", "gemma3-270m"]


def extract(store: Path, model: str, *extra: str) -> None:
    argv = [
        "--model",
        model,
        "--store",
        str(store),
        "--backend",
        "dummy",
        "--variants",
        "none",
        "--no-progress",
    ]
    res = runner.invoke(extract_app, [*argv, "--dataset", "facts", "--size", "60", *extra])
    assert res.exit_code == 0, res.output


def train(argv: list[str], code: int = 0) -> str:
    res = runner.invoke(train_cli.app, argv)
    assert res.exit_code == code, res.output
    return res.output


def fix_command(text: str, after: str) -> list[str]:
    """The `walla train` command a message suggests (after `after`), as the arguments of `walla train`."""
    line = next(ln for ln in text.splitlines() if after in ln)
    words = shlex.split(line.split(after, 1)[1].strip().removesuffix(")"))
    assert words[:2] == ["walla", "train"], line  # the command users type, not the old alias
    return words[2:]


@pytest.fixture(scope="module")
def sequence(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lineage")
    store, runs = tmp / "store", tmp / "runs"
    for model in ("smollm2-135m", "gemma3-270m"):
        extract(store, model)
    base = ["--scenario", "hetero", "--models", "smollm2-135m,gemma3-270m", "--store", str(store)]
    base += ["--runs", str(runs), "--methods", "walla-i", "--set", "walla.epochs=2"]
    train([*base, "--seed-list", "18,19", "--save-states", "walla-i"])
    train([*base, "--seed-list", "18", *JOIN, "--save-states", "walla-i"])  # a join a market head can play
    # gemma3 extracted again, otherwise (another backend seed: the float32 re-extraction of the issue)
    for info in list_feature_sets(store):
        if info.model == "gemma3-270m":
            res = runner.invoke(store_app, ["rm", info.fingerprint, "--store", str(store), "--yes"])
            assert res.exit_code == 0, res.output
    extract(store, "gemma3-270m", "--backend-arg", "seed=1")
    train([*base, "--seed-list", "18,19", "--save-states", "walla-i"])  # the plain base command
    train([*base, "--seed-list", "19", *JOIN])
    return store, runs, base


def test_a_join_of_a_base_retrained_since_is_not_counted(sequence):
    _, runs, _ = sequence
    found = load_scenario_runs(runs, JOINED)
    rows = {row: sorted(by_seed) for row, by_seed in found.runs.items()}
    assert rows["walla-i"] == [19]  # one row, of the join of the current base only
    (stale,) = [p for p in found.problems if p.method == "walla-i"]
    assert (stale.kind, stale.seed) == ("stale", 18)
    assert f"it continued runs of base scenario {BASE} of inputs" in stale.detail
    # the market plays the same runs: replays and `walla serve` (choose_runs), live heads (read_current_run_meta)
    assert list(choose_runs(runs, JOINED).seeds) == [19]
    with pytest.raises(RunChoiceError, match="no current run for seed.s. 18"):
        choose_runs(runs, JOINED, seeds=[18])
    seed18 = next(iter((runs / JOINED / "walla-i").iterdir())) / "seed=18"
    with pytest.raises(RunFormatError, match=f"stale run: it continued runs of base scenario {BASE}"):
        read_current_run_meta(seed18)
    assert read_run_meta(seed18)["continued"]["scenario"] == BASE


def test_the_suggested_fix_rejoins_and_the_row_holds_both_seeds(sequence, tmp_path):
    _, runs, _ = sequence
    mine = tmp_path / "runs"
    shutil.copytree(runs, mine)
    (stale,) = [p for p in load_scenario_runs(mine, JOINED).problems if p.method == "walla-i"]
    argv = fix_command(stale.detail.replace(str(runs), str(mine)), "not counted: rerun ")
    assert argv[argv.index("--scenario") + 1] == "hetero" and "--drop-agent" in argv  # the join's own command
    # the run holds its heads: the rerun keeps them (issue 47, item 3: without --save-states it dropped them)
    assert argv[-6:] == ["--methods", "walla-i", "--seed-list", "18", "--save-states", "walla-i"]
    train(argv)  # run as suggested (the real resolver): rejoins seed 18
    found = load_scenario_runs(mine, JOINED)
    assert sorted(found.runs["walla-i"]) == [18, 19] and not found.problems
    AgentHead.from_run(found.runs["walla-i"][18].path, slot=0)  # its heads, for the market, still there
    (base18,) = (mine / BASE / "walla-i").glob("*/seed=18")
    continued = read_current_run_meta(found.runs["walla-i"][18].path)["continued"]
    assert continued["inputs_id"] == read_run_meta(base18)["inputs_id"]


def test_a_join_refusal_names_a_command_that_trains_the_missing_base_run(sequence, tmp_path):
    """The base of a kind-built scenario (hetero-facts) is no manifest: `walla train --scenario
    hetero-facts` fails with "no such scenario". The refusal names the kind's command instead."""
    _, runs, base = sequence
    mine = tmp_path / "runs"
    shutil.copytree(runs, mine)
    argv = [a.replace(str(runs), str(mine)) for a in base]
    out = train([*argv, "--seed-list", "20", *JOIN], code=1)  # a base run missing: state (cli/exits.py DATA)
    assert "no base run of key" in out and "seed 20" in out and "walla-train" not in out
    fix = fix_command(out, "train the base scenario with its states first: ")
    assert fix[fix.index("--scenario") + 1] == "hetero" and "--add-agent" not in fix
    assert fix[-6:] == ["--methods", "walla-i", "--seed-list", "20", "--save-states", "walla-i"]
    train(fix)  # the suggested command, through the real resolver: trains the base run of seed 20
    train([*argv, "--seed-list", "20", *JOIN])  # now the join goes through
    assert sorted(load_scenario_runs(mine, JOINED).runs["walla-i"]) == [19, 20]


def test_a_market_heads_printed_fixes_run_as_printed_to_their_end(sequence, tmp_path):
    """Issue 47, item 3: a stale joined seed's fix (walla market agent --head, read_current_run_meta) kept
    --save-states, and the follow-up for a run without heads (AgentHead.from_run) names --seed-list: each,
    run as printed, ends in a head the market can play. Before, the first deleted the run's state.pt and
    the second trained the joined scenario's default seeds, whose base runs do not exist, and failed."""
    _, runs, _ = sequence
    mine = tmp_path / "runs"
    shutil.copytree(runs, mine)
    kdir = next(iter((mine / JOINED / "walla-i").iterdir()))
    with pytest.raises(RunFormatError, match="stale run: ") as e:
        AgentHead.from_run(kdir / "seed=18", slot=0)
    argv = fix_command(str(e.value).replace(str(runs), str(mine)), "not used: rerun ")  # the copy's runs
    assert argv[-6:] == ["--methods", "walla-i", "--seed-list", "18", "--save-states", "walla-i"]
    train(argv)
    AgentHead.from_run(kdir / "seed=18", slot=0)  # current, with its heads
    with pytest.raises(HeadError, match="no state.pt: ") as e:  # seed 19 was joined without its heads
        AgentHead.from_run(kdir / "seed=19", slot=0)
    argv = fix_command(str(e.value).replace(str(runs), str(mine)), "--save-states; rerun ")
    assert argv[-6:] == ["--methods", "walla-i", "--seed-list", "19", "--save-states", "walla-i"]
    train(argv)
    AgentHead.from_run(kdir / "seed=19", slot=0)
    found = load_scenario_runs(mine, JOINED)
    assert sorted(found.runs["walla-i"]) == [18, 19] and not found.problems
