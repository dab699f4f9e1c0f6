"""Agents joining a trained WALLA market (train/join.py): old heads continue, the newcomer starts fresh."""

from __future__ import annotations

import dataclasses
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
from walla.train.runs import STATE, list_run_dirs, read_run_meta

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


def test_joined_heads_start_from_the_trained_ones(trained):
    full, plan, runs = trained
    joined, origin = joined_plan(plan, ["b"], [], epochs=1)
    assert (
        joined.spec.name == "base+b"
        and joined.spec.agents == ("a", "a", "a", "b")
        and origin == [0, 1, 2, -1]
    )
    assert joined.method("walla-i").config.epochs == 1
    data = _agents(full, [0, 1, 2, 3], "base+b")
    init = initial_params(joined, "base", origin, data, runs)
    old = load_checkpoint(one_run(runs, "base", "walla-i", 18) / STATE)["params"]
    new = init["walla-i"][18]
    for p_new, p_old in zip(new, old, strict=True):  # agents 0..2 continue, padded to the newcomer's H
        idx = (slice(0, 3), *(slice(0, d) for d in p_old.shape[1:]))
        torch.testing.assert_close(p_new[idx], p_old)
    assert new[0][3, :9].abs().sum() > 0  # the newcomer's fresh head (its input is 9 wide)
    res = run_plan(joined, data, runs, TrainEnv(), note=lambda s: None, initial=init, initial_from="base")
    assert [r["status"] for r in res] == ["done", "done"]
    meta = read_run_meta(one_run(runs, "base+b", "walla-i", 18))
    assert meta["initialized"] == "continued from base" and meta["config"]["epochs"] == 1


def test_dropping_an_agent_and_missing_base_runs(trained):
    full, plan, runs = trained
    left, origin = joined_plan(plan, [], ["a"])
    assert left.spec.agents == ("a", "a") and origin == [0, 1]
    with pytest.raises(ValueError, match="not an agent of base"):
        joined_plan(plan, [], ["zzz"])
    data = _agents(full, [0, 1], "base-a")
    other = dataclasses.replace(plan, seeds=(77,))
    with pytest.raises(FileNotFoundError, match="--seed-list 77 --save-states walla-i"):
        initial_params(other, "base", origin, data, runs)
    np.testing.assert_array_equal(data.hidden[0], full.hidden[0])


def test_the_base_run_continued_is_the_one_of_the_joined_config(trained, tmp_path):
    full, plan, base_runs = trained
    runs = tmp_path / "runs"
    shutil.copytree(base_runs, runs)
    base = _agents(full, [0, 1, 2], "base")
    other = dataclasses.replace(plan, seeds=(18,))
    other = with_method_config(other, "walla-i", lr=1.0e-3)
    run_plan(other, base, runs, TrainEnv(), note=lambda s: None, save_states={"walla-i"})  # a second key
    data = _agents(full, [0, 1, 2, 3], "base+b")
    states = {
        read_run_meta(d.path)["config"]["lr"]: load_checkpoint(d.path / STATE)["params"]
        for d in list_run_dirs(runs, "base")
        if d.seed == 18
    }
    assert sorted(states) == [1e-3, 3e-3]
    for p, lr in ((plan, 3e-3), (other, 1e-3)):
        joined, origin = joined_plan(p, ["b"], [], epochs=1)
        new = initial_params(joined, "base", origin, data, runs)["walla-i"][18]
        torch.testing.assert_close(new[0][:3, : states[lr][0].shape[1]], states[lr][0])
    # the same config trained again in bf16: two base runs could be meant, and the error names both
    run_plan(
        other, base, runs, TrainEnv(precision="bf16-mixed"), note=lambda s: None, save_states={"walla-i"}
    )
    joined, origin = joined_plan(other, ["b"], [], epochs=1)
    with pytest.raises(ValueError, match="2 trained runs of walla-i seed 18 with this config"):
        initial_params(joined, "base", origin, data, runs)


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
    joined, origin = joined_plan(plan, ["b"], [], epochs=1)
    data = _agents(full, [0, 1, 2, 3], "base+b")
    with pytest.raises(FileNotFoundError, match="--seed-list 18 --save-states walla-i"):
        initial_params(joined, "base", origin, data, runs)
