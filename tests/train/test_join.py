"""Agents joining a trained WALLA market (train/join.py): old heads continue, the newcomer starts fresh."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from synthetic import make_private_context_scenario
from walla.manifests.scenario import Scenario, ScenarioSpec
from walla.train.engine import TrainEnv, load_checkpoint
from walla.train.join import initial_params, joined_plan
from walla.train.plan import Overrides, build_plan
from walla.train.run import run_plan
from walla.train.runs import (
    RUN_META,
    STATE,
    TRAIN_SCHEMA,
    RunFormatError,
    inputs_id,
    lineage_reason,
    list_run_dirs,
    read_current_run_meta,
    read_run_meta,
    stale_run_reason,
)

HP = {"walla": {"lr": 3.0e-3, "epochs": 2, "hidden": [8], "projection_dim": None, "batch_size": 20}}


def _agents(data, slots: list[int], name: str):
    """The scenario restricted to some agent slots."""
    return dataclasses.replace(
        data,
        name=name,
        agents=[data.agents[i] for i in slots],
        probs=data.probs[:, slots],
        prompt_nll=data.prompt_nll[:, slots],
        variant=data.variant[:, slots],
        hidden=[data.hidden[i] for i in slots],
    )


def one_run(runs: Path, scenario: str, method: str, seed: int) -> Path:
    (path,) = [d.path for d in list_run_dirs(runs, scenario) if d.method == method and d.seed == seed]
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    full = make_private_context_scenario(n=200, m=4, k=2, h=[6, 6, 6, 9], seed=5)
    full = dataclasses.replace(full, agents=["a", "a", "a", "b"])
    base = _agents(full, [0, 1, 2], "base")
    spec = ScenarioSpec(name="base", dataset="synthetic", agents=("a", "a", "a"), description="base")
    problems: list[str] = []
    train = {"methods": ["walla-i"], "seeds": [18, 19], "hparams": HP}
    plan = build_plan({"train": train}, Path("x.yaml"), Scenario(spec, {}, {}), Overrides(), problems)
    assert not problems
    runs = tmp_path_factory.mktemp("runs")
    run_plan(plan, base, runs, TrainEnv(), note=lambda s: None, save_states={"walla-i"})
    return full, plan, runs


def join(plan, runs: Path, full, add=("b",), env=None, slots=(0, 1, 2, 3)):
    """initial_params of `plan` joined by `add`, continuing base runs in `runs` (returns joined plan too)."""
    joined, origin = joined_plan(plan, list(add), [], epochs=1)
    base, data = _agents(full, [0, 1, 2], "base"), _agents(full, list(slots), joined.spec.name)
    return joined, data, initial_params(plan, joined, origin, base, data, runs, env or TrainEnv())


def test_joined_heads_start_from_the_trained_ones(trained):
    full, plan, runs = trained
    joined, origin = joined_plan(plan, ["b"], [], epochs=1)
    assert (
        joined.spec.name == "base+b"
        and joined.spec.agents == ("a", "a", "a", "b")
        and origin == [0, 1, 2, -1]
    )
    assert joined.method("walla-i").config.epochs == 1
    joined, data, init = join(plan, runs, full)
    base18 = one_run(runs, "base", "walla-i", 18)
    old = load_checkpoint(base18 / STATE)["params"]
    new = init["walla-i"].params[18]
    for p_new, p_old in zip(new, old, strict=True):  # agents 0..2 continue, padded to the newcomer's H
        idx = (slice(0, 3), *(slice(0, d) for d in p_old.shape[1:]))
        torch.testing.assert_close(p_new[idx], p_old)
    assert new[0][3, :9].abs().sum() > 0  # the newcomer's fresh head (its input is 9 wide)
    res = run_plan(joined, data, runs, TrainEnv(), note=lambda s: None, initial=init)
    assert [r["status"] for r in res] == ["done", "done"]
    meta = read_run_meta(one_run(runs, "base+b", "walla-i", 18))
    base_kid = base18.parent.name
    assert meta["initialized"] == {"continued_from": "base", "base_key_id": base_kid}
    assert meta["run_key"]["init"] == meta["initialized"] and meta["config"]["epochs"] == 1
    # each seed's inputs id covers its base run's: a joined run of a base run retrained otherwise is redone
    assert meta["inputs_id"] == inputs_id(meta["run_key"], 18, read_run_meta(base18)["inputs_id"])


def test_dropping_an_agent_and_missing_base_runs(trained):
    full, plan, runs = trained
    left, origin = joined_plan(plan, [], ["a"])
    assert left.spec.agents == ("a", "a") and origin == [0, 1]
    with pytest.raises(ValueError, match="not an agent of base"):
        joined_plan(plan, [], ["zzz"])
    data = _agents(full, [0, 1], "base-a")
    other = dataclasses.replace(plan, seeds=(77,))
    left, origin = joined_plan(other, [], ["a"])
    base = _agents(full, [0, 1, 2], "base")
    with pytest.raises(FileNotFoundError, match="no trained walla-i run of seed 77.*--seed-list 77"):
        initial_params(other, left, origin, base, data, runs, TrainEnv())
    np.testing.assert_array_equal(data.hidden[0], full.hidden[0])


def test_a_single_base_run_of_another_config_is_not_continued(trained):
    """Finding 6: with ONE base run (lr 3e-3), joining at lr 1e-3 used to continue it silently."""
    full, plan, runs = trained
    other = with_method_config(plan, "walla-i", lr=1.0e-3)
    with pytest.raises(FileNotFoundError) as err:
        join(other, runs, full)
    line = str(err.value)
    kid = one_run(runs, "base", "walla-i", 18).parent.name
    assert (
        "\n" not in line and f"seed 18 is trained only under key {kid}: config.lr 0.003 (not 0.001)" in line
    )
    # nor one of another precision: the key includes it
    with pytest.raises(
        FileNotFoundError, match=f"only under key {kid}: precision '32-true' .not 'bf16-mixed'"
    ):
        join(plan, runs, full, env=TrainEnv(precision="bf16-mixed"))


def _edit_run(path: Path, edit) -> None:
    meta = json.loads((path / RUN_META).read_text())
    edit(meta)
    (path / RUN_META).write_text(json.dumps(meta))


def test_a_stale_base_run_is_refused(trained, tmp_path):
    """Finding 6: a base run of another TRAIN_SCHEMA, or trained from other inputs, is never continued."""
    full, plan, base_runs = trained
    runs = tmp_path / "runs"
    shutil.copytree(base_runs, runs)
    run18 = one_run(runs, "base", "walla-i", 18)
    _edit_run(run18, lambda m: m["run_key"].update(schema=TRAIN_SCHEMA - 1))
    with pytest.raises(
        ValueError, match=f"{run18}: stale base run .trained by walla train schema {TRAIN_SCHEMA - 1}"
    ):
        join(plan, runs, full)
    _edit_run(run18, lambda m: m["run_key"].update(schema=TRAIN_SCHEMA))
    join(plan, runs, full)  # the same run, current again: continued
    # the base scenario's features changed since (another fingerprint): its runs are of other inputs
    changed = dataclasses.replace(full, fingerprints={**full.fingerprints, "synth0/mixed": "f" * 16})
    with pytest.raises(ValueError, match="stale base run .trained from other inputs"):
        join(plan, runs, changed)
    (run18 / STATE).unlink()
    with pytest.raises(ValueError, match=f"{run18}: no trained heads .state.pt. to continue"):
        join(plan, runs, full)


def test_the_base_run_continued_is_the_one_of_the_joined_config(trained, tmp_path):
    full, plan, base_runs = trained
    runs = tmp_path / "runs"
    shutil.copytree(base_runs, runs)
    base = _agents(full, [0, 1, 2], "base")
    other = dataclasses.replace(plan, seeds=(18,))
    other = with_method_config(other, "walla-i", lr=1.0e-3)
    run_plan(other, base, runs, TrainEnv(), note=lambda s: None, save_states={"walla-i"})  # a second key
    states = {
        read_run_meta(d.path)["config"]["lr"]: load_checkpoint(d.path / STATE)["params"]
        for d in list_run_dirs(runs, "base")
        if d.seed == 18
    }
    assert sorted(states) == [1e-3, 3e-3]
    for p, lr in ((plan, 3e-3), (other, 1e-3)):
        new = join(p, runs, full)[2]["walla-i"].params[18]
        torch.testing.assert_close(new[0][:3, : states[lr][0].shape[1]], states[lr][0])
    # the same config trained again in bf16 beside it: each precision continues its own base run
    run_plan(
        other, base, runs, TrainEnv(precision="bf16-mixed"), note=lambda s: None, save_states={"walla-i"}
    )
    bf16 = [d.path for d in list_run_dirs(runs, "base") if read_run_meta(d.path)["precision"] == "bf16-mixed"]
    cont = join(other, runs, full, env=TrainEnv(precision="bf16-mixed"))[2]["walla-i"]
    assert (
        cont.init["base_key_id"]
        == bf16[0].parent.name
        != join(other, runs, full)[2]["walla-i"].init["base_key_id"]
    )
    torch.testing.assert_close(cont.params[18][0][:3, :6], load_checkpoint(bf16[0] / STATE)["params"][0])


def with_method_config(plan, name: str, **changes):
    from walla.manifests.validate import replace

    methods = tuple(
        dataclasses.replace(m, config=replace(m.config, **changes)) if m.name == name else m
        for m in plan.methods
    )
    return dataclasses.replace(plan, methods=methods)


def test_a_base_run_trained_without_its_state_names_the_flag(trained, tmp_path):
    """Runs write state.pt only with --save-states: joining a base trained without says how to get it."""
    full, plan, base_runs = trained
    runs = tmp_path / "runs"
    shutil.copytree(base_runs, runs)
    base = _agents(full, [0, 1, 2], "base")
    run_plan(plan, base, runs, TrainEnv(), note=lambda s: None, force=True)  # no save_states: no state
    assert not any((d.path / STATE).exists() for d in list_run_dirs(runs, "base"))
    with pytest.raises(ValueError, match="no trained heads .state.pt.*--seed-list 18 --save-states walla-i"):
        join(plan, runs, full)


def test_a_joined_run_counts_only_while_its_base_run_is_current(trained, tmp_path):
    """Issue 37 finding 2: the lineage check (lineage.lineage_reason) that eval, replays and live heads make."""
    full, plan, base_runs = trained
    runs = tmp_path / "runs"
    shutil.copytree(base_runs, runs)
    joined, data, init = join(plan, runs, full)
    run_plan(joined, data, runs, TrainEnv(), note=lambda s: None, initial=init, save_states={"walla-i"})
    path = one_run(runs, "base+b", "walla-i", 18)
    meta, base18 = read_run_meta(path), one_run(runs, "base", "walla-i", 18)
    current = json.loads((runs / "base+b" / "scenario.json").read_text())["inputs_id"]
    assert meta["run_key"]["base_inputs_id"] == read_run_meta(base18)["run_key"]["scenario_inputs_id"]
    assert stale_run_reason(path, meta, current) is None
    _edit_run(base18, lambda m: m.update(inputs_id="0" * 16))  # the base run retrained since
    assert "was retrained since it was continued" in stale_run_reason(path, meta, current)
    with pytest.raises(RunFormatError, match="stale run: the base run it continued .* was retrained since"):
        read_current_run_meta(path)
    _edit_run(base18, lambda m: m["run_key"].update(schema=TRAIN_SCHEMA - 1))  # ... or stale itself
    assert f"does not count: trained by walla train schema {TRAIN_SCHEMA - 1}" in lineage_reason(path, meta)
    (base18 / RUN_META).unlink()
    assert lineage_reason(path, meta) == f"the base run it continued ({base18}) is gone"
    del meta["continued"]  # joined by a walla train before lineage was recorded
    assert "without the record of the base run it continued" in lineage_reason(path, meta)
