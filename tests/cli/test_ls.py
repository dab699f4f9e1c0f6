"""`walla ls` lists exactly the names of each registry (the first column), so what it prints is what the
commands accept."""

from __future__ import annotations

import pytest
from walla.cli.lazy import run
from walla.cli.main import app
from walla.extract.backends.registry import backend_names
from walla.manifests import catalog
from walla.manifests.names import KINDS
from walla.manifests.scenario import list_scenarios
from walla.train.methods import REGISTRY


def _names(capfd, *argv: str) -> list[str]:
    assert run(app, ["ls", *argv], "walla") == 0
    return [line.split()[0] for line in capfd.readouterr().out.splitlines() if line.strip()]


@pytest.mark.parametrize(
    ("what", "registry"),
    [
        ("models", lambda: list(catalog.load_models())),
        ("datasets", lambda: list(catalog.load_datasets())),
        ("backends", backend_names),
        ("methods", lambda: list(REGISTRY)),
    ],
)
def test_ls_lists_the_registry(capfd, what, registry):
    assert _names(capfd, what) == registry()


def test_ls_scenarios_lists_kinds_manifests_and_trained_runs(capfd, tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "scenario.json").write_text("{}")
    (tmp_path / "not-a-scenario").mkdir()
    names = _names(capfd, "scenarios", "--runs", str(tmp_path))
    assert names == [*KINDS, *list_scenarios(), "mine"]


def test_ls_of_an_unknown_registry_is_a_usage_error(capfd):
    assert run(app, ["ls", "modles"], "walla") == 2
    (line,) = capfd.readouterr().err.strip().splitlines()
    assert line.startswith("walla ls: error:") and "models" in line
