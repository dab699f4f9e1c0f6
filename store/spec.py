"""Scenario specs: WHICH rows and features a scenario assembles (the store's half of a scenario file).

    spec = load_spec("demo-hetero-facts")           # manifests/scenarios/<name>.yaml, or any YAML path
    data = assemble_scenario(spec, Path("walla-store"))

A scenario file has three top-level keys (plus `include:` and comments):

    description: one line for tables and the training plan (`--show-plan`)
    scenario:            # read here, by the store: dataset, agents, context routing
      dataset: facts
      agents: [smollm2-135m, smollm2-135m, gemma3-270m, gemma3-270m]
      context_rule: one_relevant
    train:               # read by the train stage (train/plan.py): methods, seeds, hyper-parameters

The store validates `scenario:` against the model and dataset tables and never looks inside `train:`.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Literal

from walla.store.catalog import DatasetEntry, ModelEntry, collect_tables
from walla.store.validate import ConfigError, check, collect, config
from walla.store.yaml_io import manifests_dir, read_yaml

CONTEXT_RULES = ("none", "one_relevant", "one_relevant_one_irrelevant")
SECTIONS = ("description", "scenario", "train")


@config
class ScenarioSpec:
    name: str
    dataset: str  # train/val/test rows (test too, unless eval_dataset is set)
    agents: tuple[str, ...]  # model name per slot (M = len)
    context_rule: Literal["none", "one_relevant", "one_relevant_one_irrelevant"] = "none"
    context_seed: int = 42  # seeds the per-split balanced context assignment (fixed across repeats)
    eval_dataset: str | None = None  # OOD: every row of this dataset is test
    description: str = ""
    source: str = ""  # the YAML file it came from

    def __post_init__(self) -> None:
        check(len(self.agents) >= 1, "agents", "at least one model", list(self.agents))
        if self.context_rule == "one_relevant_one_irrelevant":
            check(len(self.agents) >= 2, "agents", f"at least 2 for {self.context_rule}", list(self.agents))

    @property
    def n_agents(self) -> int:
        return len(self.agents)


def list_scenarios(directory: Path | None = None) -> list[str]:
    """Names of the scenario manifests (files starting with '_' are shared fragments, not scenarios)."""
    d = Path(directory) if directory else manifests_dir() / "scenarios"
    return sorted(p.stem for p in d.glob("*.yaml") if not p.name.startswith("_"))


def scenario_path(name_or_path: str | Path) -> Path:
    """A scenario name -> manifests/scenarios/<name>.yaml; a path (or anything ending in .yaml) as is.

    Raises:
        ConfigError: an unknown name, with close matches and the available names.
    """
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.is_file():
            raise ConfigError([f"{p}: scenario file not found" + (" (a directory)" if p.is_dir() else "")])
        return p
    cand = manifests_dir() / "scenarios" / f"{name_or_path}.yaml"
    if not cand.is_file():
        avail = list_scenarios()
        close = difflib.get_close_matches(str(name_or_path), avail, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError([f"no such scenario {str(name_or_path)!r}{hint}; available: {', '.join(avail)}"])
    return cand


def read_scenario_file(path: Path, problems: list[str]) -> dict:
    """The merged YAML of a scenario file (includes resolved); unknown top-level keys are problems."""
    raw = read_yaml(path, problems)
    for key in raw:
        if key not in SECTIONS:
            close = difflib.get_close_matches(str(key), [*SECTIONS, "dataset", "agents"], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            nested = " (scenario keys go under `scenario:`, training keys under `train:`)"
            problems.append(
                f"{path}: unknown top-level key {key!r}{hint}; allowed: {', '.join(SECTIONS)}{nested}"
            )
    return raw


def _ref(value: str | None, known: dict, what: str, where: str, problems: list[str]) -> None:
    if value is not None and value not in known:
        close = difflib.get_close_matches(str(value), list(known), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append(f"{where}: unknown {what} {value!r}{hint}; available: {', '.join(known)}")


def spec_from_raw(
    raw: dict,
    path: Path,
    models: dict[str, ModelEntry],
    datasets: dict[str, DatasetEntry],
    problems: list[str],
) -> ScenarioSpec | None:
    """Validate the `scenario:` section (and description) of a merged scenario file."""
    section = raw.get("scenario")
    where = f"{path}: scenario"
    if not isinstance(section, dict):
        problems.append(f"{where}: expected a mapping with dataset, agents, context_rule, got {section!r}")
        return None
    fields = {**section, "name": path.stem, "source": str(path), "description": raw.get("description", "")}
    n0 = len(problems)
    spec = collect(ScenarioSpec, fields, where, problems)
    if spec is None:
        return None
    _ref(spec.dataset, datasets, "dataset", f"{where}.dataset", problems)
    _ref(spec.eval_dataset, datasets, "dataset", f"{where}.eval_dataset", problems)
    for i, a in enumerate(spec.agents):
        _ref(a, models, "model", f"{where}.agents[{i}]", problems)
    if spec.context_rule != "none":
        for key in ("dataset", "eval_dataset"):
            ds = datasets.get(getattr(spec, key))
            if ds is not None and not ds.has_context:
                problems.append(
                    f"{where}.context_rule: {spec.context_rule!r} needs a dataset with contexts; "
                    f"{key} {ds.name!r} has has_context: false"
                )
    return spec if len(problems) == n0 else None


def load_spec(name_or_path: str | Path, directory: Path | None = None) -> ScenarioSpec:
    """The ScenarioSpec of a scenario name or file. Raises ConfigError listing every problem."""
    path = scenario_path(name_or_path)
    problems: list[str] = []
    models, datasets = collect_tables(directory, problems)
    spec = spec_from_raw(read_scenario_file(path, problems), path, models, datasets, problems)
    if problems:
        raise ConfigError(problems)
    assert spec is not None
    return spec
