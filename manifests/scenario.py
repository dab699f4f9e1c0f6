"""Scenario files: read once into a Scenario that the store assembles and the train stage plans.

    scenario = read_scenario("demo-hetero-facts")     # manifests/scenarios/<name>.yaml, or any YAML path
    data = assemble_scenario(scenario, Path("walla-store"))               # store/scenario/_assemble.py
    plan = load_plan("demo-hetero-facts")              # train/plan.py: parse_scenario(name, build_plan)

A scenario file has three top-level keys (plus `include:` and comments):

    description: one line for tables and the training plan (`--show-plan`)
    scenario:            # WHICH rows and features: checked here against the model and dataset tables
      dataset: facts
      agents: [smollm2-135m, smollm2-135m, gemma3-270m, gemma3-270m]
      context_rule: one_relevant
    train:               # WHAT runs on them: read by the train stage (train/plan.py), which knows the methods

`parse_scenario` is the one function that reads a scenario file. It checks the `scenario:` section here
and hands the merged file to a stage's builder (the train stage's `build_plan`), so every problem of the
file -- spec and methods alike -- is reported together, each naming the file and the key.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from walla.manifests.catalog import DatasetEntry, ModelEntry, collect_tables
from walla.manifests.validate import ConfigError, check, collect, config, to_dict
from walla.manifests.yaml_io import read_yaml, scenarios_dir, with_includes

T = TypeVar("T")

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

    def as_dict(self) -> dict:
        """Plain data (lists, not tuples), as recorded in an assembled scenario's meta."""
        return to_dict(self)


@dataclass(frozen=True)
class Scenario:
    """One scenario, read once: its spec and the model and dataset tables the spec was checked against.

    The store assembles it (the tables give soft targets and hidden sizes); the train stage plans it.
    """

    spec: ScenarioSpec
    models: dict[str, ModelEntry]
    datasets: dict[str, DatasetEntry]


# what a stage makes of a scenario file: build(merged file, its path, the Scenario or None, problems)
Build = Callable[[dict, Path, "Scenario | None", list[str]], T]


def list_scenarios(directory: Path | None = None) -> list[str]:
    """Names of the scenario manifests (files starting with '_' are shared fragments, not scenarios)."""
    d = Path(directory) if directory else scenarios_dir()
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
    cand = scenarios_dir() / f"{name_or_path}.yaml"
    if not cand.is_file():
        avail = list_scenarios()
        close = difflib.get_close_matches(str(name_or_path), avail, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError([f"no such scenario {str(name_or_path)!r}{hint}; available: {', '.join(avail)}"])
    return cand


def _check_sections(raw: dict, path: Path, problems: list[str]) -> None:
    """Unknown top-level keys of a merged scenario file are problems (with the likely intended key)."""
    for key in raw:
        if key not in SECTIONS:
            close = difflib.get_close_matches(str(key), [*SECTIONS, "dataset", "agents"], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            nested = " (scenario keys go under `scenario:`, training keys under `train:`)"
            problems.append(
                f"{path}: unknown top-level key {key!r}{hint}; allowed: {', '.join(SECTIONS)}{nested}"
            )


def _ref(value: str | None, known: dict, what: str, where: str, problems: list[str]) -> None:
    if value is not None and value not in known:
        close = difflib.get_close_matches(str(value), list(known), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append(f"{where}: unknown {what} {value!r}{hint}; available: {', '.join(known)}")


def _check_context(
    spec: ScenarioSpec, datasets: dict[str, DatasetEntry], where: str, problems: list[str]
) -> None:
    """A context rule needs datasets whose questions have contexts."""
    if spec.context_rule == "none":
        return
    for key in ("dataset", "eval_dataset"):
        ds = datasets.get(getattr(spec, key))
        if ds is not None and not ds.has_context:
            problems.append(
                f"{where}.context_rule: {spec.context_rule!r} needs a dataset with contexts; "
                f"{key} {ds.name!r} has has_context: false"
            )


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
    _check_context(spec, datasets, where, problems)
    return spec if len(problems) == n0 else None


def _the_scenario(raw: dict, path: Path, scenario: Scenario | None, problems: list[str]) -> Scenario | None:
    """The builder that keeps only the Scenario (None only alongside problems, which are raised)."""
    return scenario


def parse_scenario(name_or_path: str | Path, build: Build[T]) -> T:
    """Read, resolve (`include:`) and check a scenario file, then hand it to a stage's `build`.

    Args:
        name_or_path: a name under manifests/scenarios/ or a YAML path.
        build: build(raw, path, scenario, problems) -> what the stage makes of the file (the train stage:
            its TrainPlan from `raw["train"]`). It runs even when the `scenario:` section has problems
            (scenario None), so that its own problems are reported with those.
    Raises:
        ConfigError: every problem of the file and its includes at once, each naming file and key.
    """
    path = scenario_path(name_or_path)
    problems: list[str] = []
    models, datasets = collect_tables(None, problems)
    raw = read_yaml(path, problems)
    if problems:  # an unreadable file (or include): its consequences would only repeat the cause
        raise ConfigError(problems)
    _check_sections(raw, path, problems)
    spec = spec_from_raw(raw, path, models, datasets, problems)
    out = build(raw, path, None if spec is None else Scenario(spec, models, datasets), problems)
    if problems:
        raise ConfigError(problems)
    return out


def read_scenario(name_or_path: str | Path) -> Scenario:
    """The Scenario of a scenario name or file (its `train:` section unread). Raises ConfigError."""
    scenario = parse_scenario(name_or_path, _the_scenario)
    assert scenario is not None  # a None spec comes with problems, raised by parse_scenario
    return scenario


def preset_scenario(scenario: Scenario, presets: Iterable[str], build: Build[T]) -> T:
    """A scenario without a file (train/kinds.py builds its spec from the store): `build` gets the merged
    preset fragments (manifests/scenarios/_*.yaml) as its file, as `include: [presets]` would merge them.

    Raises:
        ConfigError: every problem of the spec's context rule, the presets and `build` at once.
    """
    spec = scenario.spec
    problems: list[str] = []
    _check_context(spec, scenario.datasets, spec.source, problems)
    raw = with_includes({"include": list(presets)}, scenarios_dir() / f"{spec.name}.yaml", problems)
    out = build(raw, Path(spec.name), scenario, problems)
    if problems:
        raise ConfigError(problems)
    return out
