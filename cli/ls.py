"""`walla ls models | datasets | scenarios | backends | methods`: the names walla accepts, from the
registries that define them (the only lists of names), in the spirit of torchtune's `tune ls`.

    walla ls scenarios [--runs runs]     # the kinds, the manifests, and the scenarios trained under --runs

Each line is a name (the first column, as typed after its option) and what it is. Reading the registries
imports no torch: the model and dataset tables are YAML (manifests/), the backends and methods registries
name their modules without importing them.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer
from walla.cli import options
from walla.extract.backends.registry import BACKEND_KINDS, backend_names
from walla.manifests import catalog
from walla.manifests.names import KINDS, trained_scenarios
from walla.manifests.scenario import list_scenarios
from walla.manifests.yaml_io import read_yaml, scenarios_dir
from walla.train.methods import REGISTRY

app = options.app()


class What(str, Enum):
    models = "models"
    datasets = "datasets"
    scenarios = "scenarios"
    backends = "backends"
    methods = "methods"


def rows(what: str, runs: Path) -> list[tuple[str, str]]:
    """(name, what it is) for every name of one registry."""
    if what == "models":
        out = []
        parts = None
        for name, m in catalog.load_models().items():
            where = {"hub": m.hub_id, "package": f"embedded ({m.package})", "local": m.path}[m.source]
            if m.source == "package" and m.gguf == "parts()":
                from walla.extract.models import EXTRA, load_parts

                parts = load_parts() if parts is None else parts
                pm = parts.get(name)
                where = f"embedded ({pm.packages()}, pip extra {EXTRA})" if pm else where
            out.append((name, f"{where}; backend {m.backend}, dtype {m.dtype}"))
        return out
    if what == "datasets":
        return [
            (
                name,
                f"loader {d.loader}"
                + (", with contexts" if d.has_context else "")
                + (", soft targets" if d.soft_target else ""),
            )
            for name, d in catalog.load_datasets().items()
        ]
    if what == "scenarios":
        kinds = [(k, "a scenario kind, built from the store: --scenario " + k) for k in KINDS]
        manifests = []
        for name in list_scenarios():
            problems: list[str] = []
            text = str(read_yaml(scenarios_dir() / f"{name}.yaml", problems).get("description", "")).strip()
            manifests.append((name, "manifest: " + (text.splitlines()[0] if text else "(no description)")))
        trained = [(name, f"trained under {runs}") for name in trained_scenarios(runs)]
        return kinds + manifests + trained
    if what == "backends":
        kinds = {n: BACKEND_KINDS[n] for n in backend_names()}
        return [
            (n, "its kind: " + (k if isinstance(k, str) else type(k).__module__)) for n, k in kinds.items()
        ]
    return [
        (name, f"{m.display} ({m.group}, family {m.family}{'' if m.default else '; not run by default'})")
        for name, m in REGISTRY.items()
    ]


@app.command()
def ls(
    what: What = typer.Argument(..., help="models | datasets | scenarios | backends | methods"),
    runs: Path = typer.Option(Path("runs"), "--runs", help="scenarios: also list those trained here"),
) -> None:
    """List the names walla accepts: models, datasets, scenarios, backends or methods."""
    table = rows(what.value, runs)
    width = max((len(n) for n, _ in table), default=0)
    for name, about in table:
        typer.echo(f"{name:<{width}}  {about}")
