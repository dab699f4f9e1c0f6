"""A live head needs the run's state.pt, which walla train writes only with --save-states: a run trained
without one is refused with the command that writes it."""

from __future__ import annotations

import shutil

import pytest
from walla.market.head import AgentHead, HeadError
from walla.train.runs import STATE, choose_runs


def test_a_run_without_its_state_names_the_flag(trained, tmp_path):
    run = choose_runs(trained["runs"], trained["scenario"]).seeds[18].path
    assert AgentHead.from_run(run, slot=0).in_dim > 0  # trained with --save-states walla
    runs = tmp_path / "runs"  # the whole runs folder: a live head comes only from a run in its key directory
    shutil.copytree(trained["runs"], runs)
    copy = runs / run.relative_to(trained["runs"])
    (copy / STATE).unlink()
    with pytest.raises(HeadError, match=r"--methods walla-i --seed-list 18 --save-states walla-i") as err:
        AgentHead.from_run(copy, slot=0)
    # the command that trained it (a kind: its scenario name is no manifest), not `--scenario homo-...-x3`
    assert "rerun walla train --scenario homo --model " in str(err.value) and "--agents 3" in str(err.value)
