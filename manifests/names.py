"""The names a user types into walla, read from the registries that define them, and the one answer to
a name walla does not know: close matches from every namespace, each with the option it goes with.

    walla ls scenarios                       # the kinds, the manifests and the scenarios trained under runs/
    check_scenario("hetro", Path("runs"))    # KeyError: no such scenario 'hetro'; did you mean --scenario
                                             #   hetero (a scenario kind)? ...

Light on purpose (YAML and directory listings, no torch): every command checks its names with it before
it imports its stage, so an unknown name answers at once.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from walla.manifests import catalog
from walla.manifests.scenario import list_scenarios

KINDS = (
    "hetero",
    "homo",
    "hetero-context",
)  # the paper's scenario kinds, built from the store (train/kinds.py)
SCENARIO_JSON = "scenario.json"  # <runs>/<scenario>/scenario.json, by walla train (train/runs/_writer.py)


def close_matches(value: str, namespaces: Mapping[str, tuple[Iterable[str], str]], n: int = 3) -> list[str]:
    """'--scenario hetero (a scenario kind)', ...: the names closest to `value` over every namespace.

    `namespaces`: what the names are -> (the names, how to use one: a format string with {name}).
    """
    scored, seen = [], set()
    for what, (names, usage) in namespaces.items():
        for name in names:
            use = usage.format(name=name)
            ratio = difflib.SequenceMatcher(None, value.lower(), name.lower()).ratio()
            if use not in seen and (
                ratio >= 0.6 or (len(value) >= 3 and name.lower().startswith(value.lower()))
            ):
                seen.add(use)  # a name of two namespaces (a manifest also trained): its first
                scored.append((-ratio, f"{use} ({what})"))
    return [hint for _, hint in sorted(scored)[:n]]


def unknown(what: str, value: str, namespaces: Mapping[str, tuple[Iterable[str], str]], listing: str) -> str:
    """The one line of an unknown name: close matches over every namespace, and where the full list is."""
    close = close_matches(value, namespaces)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return f"no such {what} {value!r}{hint} ({listing})"


def trained_scenarios(runs: Path) -> list[str]:
    """The scenarios trained under `runs` (directories holding a scenario.json)."""
    runs = Path(runs)
    if not runs.is_dir():
        return []
    return sorted(d.name for d in runs.iterdir() if (d / SCENARIO_JSON).is_file())


def kind_built(name: str, runs: Path) -> dict | None:
    """The spec recorded for scenario `name` under `runs` when a kind built it (`--scenario hetero` writes
    `hetero-<dataset>`): the name walla printed is accepted back (`--add-agent`). None: not such a scenario."""
    path = Path(runs) / name / SCENARIO_JSON
    try:
        spec = json.loads(path.read_text(encoding="utf-8")).get("spec")
    except (OSError, ValueError):
        return None
    source = str((spec or {}).get("source", ""))
    kind = source.removeprefix("--scenario ").split(" ")[0]
    return spec if isinstance(spec, dict) and source.startswith("--scenario ") and kind in KINDS else None


def scenario_namespaces(
    runs: Path | None, models: Iterable[str] = (), datasets: Iterable[str] = ()
) -> dict[str, tuple[Iterable[str], str]]:
    """Every namespace a --scenario value may have come from, with the command that uses a name of it."""
    return {
        "a scenario kind": (KINDS, "--scenario {name}"),
        "a scenario manifest": (list_scenarios(), "--scenario {name}"),
        f"trained under {runs}": (trained_scenarios(runs) if runs else [], "--scenario {name}"),
        "a dataset": (datasets, "--scenario hetero --dataset {name}"),
        "a model": (models, "--scenario homo --model {name} --agents N"),
    }


def check_scenario(name: str, runs: Path | None = None) -> None:
    """Accept a kind, a manifest name, a YAML path or a kind-built scenario trained under `runs`.

    Raises:
        KeyError: anything else, with the close matches of every namespace (kinds, manifests, trained
            scenarios, datasets, models).
    """
    if name in KINDS or name in list_scenarios():
        return
    if name.endswith((".yaml", ".yml")) or Path(name).exists():
        return  # a path: read (and checked) by the recipe
    if runs is not None and kind_built(name, runs) is not None:
        return
    namespaces = scenario_namespaces(runs, catalog.load_models(), catalog.load_datasets())
    listing = f"kinds {', '.join(KINDS)}; every name: walla ls scenarios"
    raise KeyError(unknown("scenario", name, namespaces, listing))


def check_extract_names(model: str, dataset: str) -> None:
    """`--model` and `--dataset` of an extraction, checked before a model or a dataset loads.

    Raises:
        KeyError: an unknown name, with close matches among models and datasets alike.
    """
    models, datasets = catalog.load_models(), catalog.load_datasets()
    namespaces = {"a model": (models, "--model {name}"), "a dataset": (datasets, "--dataset {name}")}
    try:
        catalog.resolve_model_name(model, models)
    except KeyError as e:
        if model.startswith("hf:"):
            raise
        ways = "walla ls models; or hf:ORG/NAME[@REV], a local model directory, a .gguf file"
        raise KeyError(unknown("model", model, namespaces, ways)) from e
    if dataset not in datasets:
        raise KeyError(unknown("dataset", dataset, namespaces, "walla ls datasets"))
