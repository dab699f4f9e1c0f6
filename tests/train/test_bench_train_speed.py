"""benchmarks/train_speed.py: its synthetic scenario has exactly n rows for any n (its default 1,126 rows
crashed, issue 31), and section 7 (--only-share) runs end to end at a tiny size on the CPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "train_speed.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("train_speed", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("n", [10, 11, 19, 999, 1000, 1120, 1126, 1127])
def test_synthetic_scenario_any_row_count(bench, n):
    data = bench.synthetic_scenario(n=n, m=3, k=2, h=8, seed=1)
    sizes = {s: int((data.split == s).sum()) for s in ("train", "val", "test")}
    assert sizes == {"train": n - 2 * (n // 10), "val": n // 10, "test": n // 10}
    assert len(data.split) == len(data.question_id) == len(data.label) == n
    assert data.probs.shape == (n, 3, 2) and data.variant.shape == (n, 3)
    assert [h.shape for h in data.hidden] == [(n, 8)] * 3 and len(data.prompts[0]) == n
    # exactly one informed agent per question, and it is the one whose prompt carries the evidence
    assert ((data.variant != 0).sum(1) == 1).all()
    assert np.isclose(data.probs.sum(-1), 1.0, atol=1e-5).all()


def test_synthetic_scenario_default_rows(bench):
    """The --rows default of --only-share on an accelerator (the size that crashed), 902 / 112 / 112."""
    default = bench.share_sizes(bench.parser().parse_args([]), "cuda").rows
    data = bench.synthetic_scenario(n=default, m=2, k=2, h=4, seed=1)
    assert len(data.split) == default
    assert [int((data.split == s).sum()) for s in ("train", "val", "test")] == [902, 112, 112]


def test_synthetic_scenario_too_small(bench):
    with pytest.raises(ValueError, match="n must be >= 10"):
        bench.synthetic_scenario(n=9, m=2, k=2, h=4, seed=0)


def test_only_share_runs_tiny(bench, capsys):
    originals = [getattr(owner, attr) for owner, attr, _ in bench.PHASES]
    bench.main(
        [
            *("--only-share", "--agents", "2", "--hidden", "8", "--rows", "37"),
            *("--share-epochs", "1", "--seeds", "2", "--share-reps", "1"),
        ]
    )
    out = capsys.readouterr().out
    assert "fit wall (walla.fit, best of 1): 1 seed" in out and "floor of one seed's device steps" in out
    assert "the same fits with each read waited for at once" in out
    for _, _, label in bench.PHASES:  # the breakdown names every phase, for both fits
        assert out.count(label) == 2, label
    assert "RESULT device_step_share=" in out
    assert [getattr(owner, attr) for owner, attr, _ in bench.PHASES] == originals  # unpatched again


def test_phase_timer_counts_a_nested_phase_once(bench):
    timer = bench.PhaseTimer("cpu")
    inner = timer._timed(lambda: None, "_copy_rows")
    outer = timer._timed(lambda: [inner() for _ in range(3)], "account")
    outer()
    assert timer.seconds["account"] >= 0 and timer.seconds["_copy_rows"] >= 0
    assert set(timer.seconds) == {attr for _, attr, _ in bench.PHASES}


def test_cli_store_trains_through_walla_train(bench, tmp_path):
    """Section 8's store: walla train (in-process here) assembles the homo bayesx scenario and trains it."""
    from typer.testing import CliRunner
    from walla.train import cli

    data = bench.synthetic_scenario(n=40, m=2, k=2, h=8, seed=1)
    bench.write_cli_store(tmp_path / "store", data)
    args = bench.cli_args(tmp_path / "store", tmp_path / "runs", 3, 2, "cpu", 1)
    small = ["walla.projection_dim=null", "walla.hidden=[8]"]
    res = CliRunner().invoke(cli.app, [*args, *(a for s in small for a in ("--set", s))])
    assert res.exit_code == 0, res.output
    runs = sorted((tmp_path / "runs").rglob("run.json"))
    assert len(runs) == 2 and "homo-bayesx-bench-llm-x3" in str(runs[0])


def test_waits_at_once_changes_when_the_host_waits_not_the_numbers(bench):
    from walla.manifests.validate import build
    from walla.train.engine import TrainEnv
    from walla.train.methods import walla
    from walla.train.wagers import _training as wager_training

    data = bench.synthetic_scenario(n=60, m=3, k=2, h=8, seed=2)
    raw = {**bench.HEADS, "lr": 1e-2, "hidden": [8], "projection_dim": 16, "epochs": 2, "batch_size": 16}
    cfg = walla.resolve(build(walla.Config, raw, "test"), data)
    originals = (wager_training._WagerTraining.summary, wager_training._WagerTraining.backward)
    (now,) = walla.fit(data, cfg, [18], TrainEnv(), [None])
    with bench.waits_at_once():
        (then,) = walla.fit(data, cfg, [18], TrainEnv(), [None])
    assert all(torch.equal(a, b) for a, b in zip(now["params"], then["params"], strict=True))
    assert (wager_training._WagerTraining.summary, wager_training._WagerTraining.backward) == originals


def test_section_7_defaults_to_the_paper_size_on_an_accelerator_only(bench):
    """The paper's 4096-wide store trains only where --device names an accelerator; the CPU's default is
    small (the paper's size ran past 25 minutes on the CPU); a size on the command line wins on both."""
    args = bench.parser().parse_args([])
    paper = bench.share_sizes(args, "cuda")
    assert (paper.agents, paper.hidden, paper.rows, paper.share_epochs) == (12, 4096, 1126, 5)
    cpu = bench.share_sizes(args, "cpu")
    assert cpu.hidden < 4096 and cpu.agents < 12 and cpu.rows < 1126
    assert bench.share_sizes(bench.parser().parse_args(["--hidden", "4096"]), "cpu").hidden == 4096


def test_seeds_default_to_the_papers_five_on_an_accelerator_only(bench):
    """5 seeds' fits, per-agent loop and every method ran past 12 minutes on the shared 2-core CPU: its
    default is 2 seeds (still one fit chunk of 24 heads); --seeds wins on both; section 6 needs --all-methods
    on the CPU."""
    args = bench.parser().parse_args([])
    assert bench.share_sizes(args, "cuda").seeds == 5 and bench.share_sizes(args, "cpu").seeds == 2
    assert bench.share_sizes(args, "cuda").epochs == 2 and bench.share_sizes(args, "cpu").epochs == 1
    assert bench.share_sizes(bench.parser().parse_args(["--epochs", "2"]), "cpu").epochs == 2
    assert bench.share_sizes(bench.parser().parse_args(["--seeds", "5"]), "cpu").seeds == 5
    assert not args.all_methods and bench.parser().parse_args(["--all-methods"]).all_methods
