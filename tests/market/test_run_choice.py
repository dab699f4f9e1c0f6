"""Replay replays ONE run key: the one the user names (--key, --run), the method's only one by default, and
with several keys and none named it stops with one line listing them -- never the newest by age."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from trained_market import train_more
from walla.market.cli import run_market
from walla.market.replay import ReplayConfig, replay
from walla.train.runs import RunChoiceError, choose_runs


@pytest.fixture(scope="module")
def two_keys(trained, tmp_path_factory) -> dict:
    """The tiny market's runs plus a second walla-i run key (another lr), trained into a copy."""
    runs = tmp_path_factory.mktemp("two-keys") / "runs"
    shutil.copytree(trained["runs"], runs)
    first = _keys(runs, trained["scenario"])
    train_more(trained, runs, "walla-i", "walla.lr=0.003")
    (second,) = [k for k in _keys(runs, trained["scenario"]) if k not in first]
    return {**trained, "runs": runs, "first": first[0], "second": second}


def _keys(runs: Path, scenario: str) -> list[str]:
    return sorted(p.name for p in (runs / scenario / "walla-i").iterdir() if p.is_dir())


def _replay(capfd, m: dict, *args: str) -> tuple[int, str, list[str]]:
    argv = ["replay", "--store", str(m["store"]), "--limit", "4", *args]
    rc = run_market(argv, "walla market")
    out, err = capfd.readouterr()
    return rc, out, [x for x in err.splitlines() if x.strip()]


def test_one_key_is_the_default(trained):
    choice = choose_runs(trained["runs"], trained["scenario"], "walla-ii")
    (kid,) = _keys(trained["runs"], trained["scenario"])  # walla-i's only key
    assert choice.method == "walla-ii" and list(choice.seeds) == [18]
    assert choose_runs(trained["runs"], trained["scenario"]).key_id == kid


def test_several_keys_need_a_name(two_keys, capfd):
    m, where = two_keys, ["--scenario", two_keys["scenario"], "--runs", str(two_keys["runs"])]
    rc, out, err = _replay(capfd, m, *where)
    assert rc == 1 and len(err) == 1 and "Traceback" not in out, err
    assert "walla-i has 2 run keys" in err[0] and m["first"] in err[0] and m["second"] in err[0]
    assert "lr=0.003" in err[0] and "--key" in err[0]  # each key with what differs
    rc, out, err = _replay(capfd, m, *where, "--key", "0000000000")
    assert rc == 1 and len(err) == 1 and "is not a run key of walla-i" in err[0], err
    # walla-ii still has one key: no name needed
    rc, out, err = _replay(capfd, m, *where, "--method", "walla-ii")
    assert rc == 0 and f"walla-ii/{m['first']}" not in out and "run key walla-ii/" in out, err


def test_the_named_key_is_replayed(two_keys, capfd):
    """--key (a unique prefix will do) and --run (a key or seed directory) replay exactly that key: live
    equals ITS offline predictions, and the two keys' offline wagers differ (the wrong key could not pass)."""
    m = two_keys
    first, second = (
        choose_runs(m["runs"], m["scenario"], key=k).seeds[18] for k in (m["first"], m["second"])
    )
    assert first.path.parent.name == m["first"] and second.path.parent.name == m["second"]
    assert abs(first.extras["wagers"] - second.extras["wagers"]).max() > 1e-3
    res = replay(
        ReplayConfig(m["scenario"], m["runs"], m["store"], key=m["second"][:6], limit=6), out=lambda s: None
    )
    assert res.key_id == m["second"] and max(res.max_diff.values()) < 1e-6, res.max_diff
    key_dir = m["runs"] / m["scenario"] / "walla-i" / m["first"]
    rc, out, err = _replay(capfd, m, "--run", str(key_dir))
    assert rc == 0 and f"run key walla-i/{m['first']}" in out and "seeds [18]" in out, err
    seed_dir = choose_runs(run=key_dir.parent / m["second"] / "seed=18")
    assert seed_dir.key_id == m["second"] and list(seed_dir.seeds) == [18] and seed_dir.method == "walla-i"
    rc, out, err = _replay(capfd, m, "--run", str(key_dir), "--scenario", "other")
    assert rc == 1 and len(err) == 1 and "--scenario" in err[0], err
    rc, out, err = _replay(capfd, m, "--run", str(m["runs"] / m["scenario"]))
    assert rc == 1 and len(err) == 1 and "expected a run key directory" in err[0], err


def test_runs_of_the_old_layout_are_refused(trained, tmp_path):
    """Runs from before run keys (<method>/seed=<s>/) are stale for walla eval, so replay refuses them too."""
    runs = tmp_path / "runs"
    shutil.copytree(trained["runs"], runs)
    method = runs / trained["scenario"] / "walla-i"
    (key,) = [p for p in method.iterdir() if p.is_dir()]
    (key / "seed=18").rename(method / "seed=18")
    shutil.rmtree(key)
    with pytest.raises(RunChoiceError, match="no current walla-i runs: .*without run keys"):
        choose_runs(runs, trained["scenario"])
