"""Training imports Fabric alone: no torchmetrics, no lightning.pytorch, no transformers (issue 31).

walla's training stage uses only Lightning Fabric. The unified `lightning` package also installs
pytorch-lightning and torchmetrics, and Fabric imports torchmetrics wherever it is installed
(lightning_fabric.utilities.imports reads its version by importing it), which imports transformers,
scipy.signal and matplotlib: ~2.6 s of every `walla train` here, ~16 s on a GPU machine with slow imports.
So walla depends on `lightning-fabric`, and two tests keep it so: one walks the dependencies `make setup`
installs, one imports the train recipe in a fresh interpreter and looks at what got imported.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
SETUP_EXTRAS = ("dev", "embedded")  # the Makefile's `uv pip install -e ".[dev,embedded]"`
NOT_DEPENDENCIES = ("torchmetrics", "pytorch-lightning", "lightning")
NOT_IMPORTED = ("torchmetrics", "lightning", "pytorch_lightning", "transformers")

CHILD = r"""
import importlib.abc, json, sys
class Hide(importlib.abc.MetaPathFinder):  # walla's own environment has no torchmetrics (the test above)
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDE:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Hide())
import importlib, walla.train.run
from walla.train.methods import REGISTRY
for info in REGISTRY.values():  # every method's module: the routers' encoders load transformers on use
    importlib.import_module(info.path)
print(json.dumps(sorted(m for m in sys.modules if m.partition(".")[0] in WATCH)))
"""


def project_requirements() -> list[str]:
    """walla's requirements as pyproject.toml states them now (the installed metadata may be older)."""
    if sys.version_info < (3, 11):
        return md.requires("walla") or []
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return [*project["dependencies"], *(f"{r}; extra == {e!r}" for e in extras for r in extras[e])]


def dependency_paths(reqs: list[str], extras: tuple[str, ...]) -> dict[str, list[str]]:
    """Every distribution that installing walla with `extras` brings in -> the chain of names that pulls it
    (walla's own requirements as given, then each installed distribution's metadata)."""
    paths: dict[str, list[str]] = {}
    todo = [(reqs, set(extras), ["walla"])]
    while todo:
        requirements, wanted, chain = todo.pop()
        for line in requirements:
            req = Requirement(line)
            env = default_environment()
            if req.marker and not any(req.marker.evaluate({**env, "extra": e}) for e in {"", *wanted}):
                continue
            name = canonicalize_name(req.name)
            if name == "walla":  # walla[market] from the dev extra
                todo.append((reqs, set(req.extras), chain))
                continue
            if name in paths:
                continue
            paths[name] = [*chain, name]
            try:
                todo.append((md.requires(name) or [], set(req.extras), paths[name]))
            except md.PackageNotFoundError:
                pass  # declared but not installed here: nothing below it to walk
    return paths


def test_make_setup_installs_no_torchmetrics_nor_pytorch_lightning():
    paths = dependency_paths(project_requirements(), SETUP_EXTRAS)
    bad = {name: " -> ".join(paths[name]) for name in NOT_DEPENDENCIES if name in paths}
    assert not bad, f"walla's dependencies pull what Fabric would import on every command: {bad}"
    assert "lightning-fabric" in paths and "torch" in paths and "fastapi" in paths, sorted(paths)


def test_dependency_walk_sees_a_requirement_that_pulls_torchmetrics():
    """The walk above finds what it looks for: the full `lightning` package pulls both, as before."""
    if importlib.util.find_spec("lightning") is None:
        reqs = ["lightning-fabric[examples]"]  # Fabric's own extra that names torchmetrics
        paths = dependency_paths(reqs, ())
        assert paths["torchmetrics"] == ["walla", "lightning-fabric", "torchmetrics"]
    else:
        paths = dependency_paths(["lightning>=2.4"], ())
        assert {"torchmetrics", "pytorch-lightning"} <= set(paths), sorted(paths)


def test_train_recipe_imports_fabric_without_torchmetrics_or_transformers():
    """`import walla.train.run` and every method's module in a fresh interpreter (transformers loads only
    where a router encodes texts that are not cached). Where torchmetrics is installed anyway (a user's
    `lightning` for --logger wandb), the child hides it, as walla's own environment has none."""
    hide = ["torchmetrics"] if importlib.util.find_spec("torchmetrics") else []
    watch = [*NOT_IMPORTED, "lightning_fabric", "torch"]
    code = f"HIDE = {hide!r}\nWATCH = {watch!r}\n" + CHILD
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    roots = {m.partition(".")[0] for m in json.loads(proc.stdout.strip().splitlines()[-1])}
    assert {"lightning_fabric", "torch"} <= roots, roots  # the test looks at a real training import
    assert not roots & set(NOT_IMPORTED), f"the train recipe imported {sorted(roots & set(NOT_IMPORTED))}"
