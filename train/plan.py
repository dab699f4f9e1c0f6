"""Train plans: WHAT runs on a scenario -- every method with its complete, typed config, and the seeds.

    plan = load_plan("demo-hetero-facts")                                   # or a YAML path
    plan = load_plan("hetero2-mmlu", Overrides(methods=("walla-i",), seeds=(18, 19)))
    print(plan_yaml(plan))                                                  # walla train --show-plan

A scenario file's `train:` section (its `scenario:` section is checked by walla.manifests.scenario, which
reads the file once and hands it here):

    train:
      methods: [uniform, stacked-gen, walla-i, walla-ii]   # or `all`; left out: the registry's default list
      seeds: [18, 19, 20, 21, 22]          # SPEC §4.5: repeat r uses 18 + r
      calibrated: false                    # calibrate every agent before every method (SPEC §9)
      calibration: {epochs: 25}            # CalibrationConfig keys (train/calibration/_temperature.py)
      hparams:                             # per method family or method name
        walla: {lr: 5.0e-7, epochs: 50}    # the family: walla-i, walla-ii, walla-i-log, walla-i-cal
        walla-ii: {lr: 1.0e-5}             # one method only

Resolution of one method's config, in order (later wins): the family's keys, the registry's definition
of the method (what makes walla-i-log pool logarithmically), the method's own keys, then command-line
overrides. Presets live only in YAML files joined by `include:` (manifests/scenarios/_*.yaml). The result
is built ONCE into the method's `Config` class (declared next to the method, validated by
walla.manifests.validate), and every problem of the whole file is reported together before any training.
Which methods exist, and which run by default, only the method registry says (train/methods/__init__.py).
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from walla.manifests.scenario import Build, Scenario, ScenarioSpec, parse_scenario
from walla.manifests.validate import check, collect, config, to_dict
from walla.train.calibration import CalibrationConfig
from walla.train.methods import ALL, REGISTRY, MethodInfo, default_methods, method_module

DEFAULT_SEEDS = (18, 19, 20, 21, 22)  # SPEC §4.5: repeat r uses 18 + r


@config
class TrainSection:
    """The `train:` section of a scenario file."""

    methods: tuple[str, ...]  # left out of the file: the registry's default methods (build_plan)
    seeds: tuple[int, ...] = DEFAULT_SEEDS
    calibrated: bool = False  # calibrate every agent once, before all methods (SPEC §9)
    calibration: dict = field(default_factory=dict)  # CalibrationConfig keys
    hparams: dict = field(default_factory=dict)  # family or method name -> {key: value}

    def __post_init__(self) -> None:
        check(len(self.methods) >= 1, "methods", "at least one method", list(self.methods))
        dup = sorted({m for m in self.methods if self.methods.count(m) > 1})
        check(not dup, "methods", "listed once each", dup)
        check(
            len(self.seeds) >= 1 and len(set(self.seeds)) == len(self.seeds),
            "seeds",
            "distinct ints",
            self.seeds,
        )


@dataclass(frozen=True)
class Overrides:
    """Command-line changes to a scenario's plan (None: keep the file's)."""

    methods: tuple[str, ...] | None = None
    seeds: tuple[int, ...] | None = None
    calibrated: bool | None = None
    hparams: dict[str, dict[str, Any]] = field(default_factory=dict)  # method or family -> keys


@dataclass(frozen=True)
class MethodPlan:
    name: str  # registry name, e.g. "walla-i-log"
    info: MethodInfo
    config: Any  # the method module's Config, complete

    @property
    def display(self) -> str:
        """Table row label naming the pooling and calibration actually used (e.g. "WALLA I (log pool)")."""
        notes = []
        if (
            getattr(self.config, "pooling", None) == "log"
        ):  # aggregation pooling (routers' `pooling` is the encoder's)
            notes.append("log pool")
        if getattr(self.config, "calibrated", False):
            notes.append("calibrated")
        if getattr(self.config, "diagnostics", False):
            notes.append("augmented")
        return self.info.display + (f" ({', '.join(notes)})" if notes else "")


@dataclass(frozen=True)
class TrainPlan:
    scenario: Scenario  # what the store assembles (walla.manifests.scenario)
    methods: tuple[MethodPlan, ...]
    seeds: tuple[int, ...]
    calibrated: bool
    calibration: Any  # CalibrationConfig (train/calibration/_temperature.py)
    source: str

    @property
    def spec(self) -> ScenarioSpec:
        return self.scenario.spec

    def method(self, name: str) -> MethodPlan:
        return next(m for m in self.methods if m.name == name)

    def to_dict(self) -> dict:
        """The resolved plan as plain data (what --show-plan prints and runs record)."""
        return {
            "scenario": self.spec.name,
            "source": self.source,
            "spec": {k: v for k, v in to_dict(self.spec).items() if k not in ("name", "source")},
            "seeds": list(self.seeds),
            "calibrated": self.calibrated,
            "calibration": to_dict(self.calibration),
            "methods": {m.name: {"display": m.display, "config": to_dict(m.config)} for m in self.methods},
        }


def _families() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, info in REGISTRY.items():
        out.setdefault(info.family, []).append(name)
    return out


def _unknown(name: str, known: list[str], what: str, where: str) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{where}: unknown {what} {name!r}{hint}; available: {', '.join(known)}"


def _expand_all(methods: Any) -> Any:
    """`all` (or `[all]`, as `--methods all` gives) -> every registered method, in registry order."""
    if methods == ALL or (isinstance(methods, list | tuple) and list(methods) == [ALL]):
        return list(REGISTRY)
    return methods


def method_keys(name: str, hparams: dict, overrides: dict) -> dict:
    """One method's raw config: family keys < registry definition < the method's keys < overrides."""
    info = REGISTRY[name]
    raw: dict = {}
    for layer in (
        hparams.get(info.family),
        info.defaults,
        hparams.get(name) if name != info.family else None,
    ):
        raw.update(layer or {})
    for key in (info.family, name):
        raw.update(overrides.get(key) or {})
    return raw


def _check_hparams(hparams: dict, where: str, problems: list[str]) -> None:
    families = _families()
    known = [*REGISTRY, *families]
    for key, val in hparams.items():
        if key not in REGISTRY and key not in families:
            problems.append(_unknown(str(key), known, "method or family", f"{where}.hparams"))
        elif not isinstance(val, dict):
            problems.append(f"{where}.hparams.{key}: expected a mapping of hyper-parameters, got {val!r}")


def build_plan(
    raw: dict, path: Path, scenario: Scenario | None, overrides: Overrides, problems: list[str]
) -> TrainPlan | None:
    """The TrainPlan of a merged scenario file; problems are appended (all of them), never raised.

    `scenario` is None when the file's `scenario:` section has problems (walla.manifests.parse_scenario):
    the `train:` section is still checked, so that both are reported at once.
    """
    where = f"{path}: train"
    section = dict(raw.get("train") or {})
    if overrides.methods is not None:
        section["methods"] = list(overrides.methods)
    if "methods" in section:
        section["methods"] = _expand_all(section["methods"])
    else:
        section["methods"] = list(default_methods())
    if overrides.seeds is not None:
        section["seeds"] = list(overrides.seeds)
    if overrides.calibrated is not None:
        section["calibrated"] = overrides.calibrated
    train = collect(TrainSection, section, where, problems)
    if train is None:
        return None
    _check_hparams(train.hparams, where, problems)
    _check_hparams(overrides.hparams, "--set", problems)
    calibration = collect(CalibrationConfig, train.calibration, f"{where}.calibration", problems)
    plans = []
    for i, name in enumerate(train.methods):
        if name not in REGISTRY:
            problems.append(_unknown(name, list(REGISTRY), "method", f"{where}.methods[{i}]"))
            continue
        keys = method_keys(name, train.hparams, overrides.hparams)
        info = REGISTRY[name]
        cfg = collect(method_module(name).Config, keys, f"{where}.hparams.{name}", problems)
        if cfg is not None:
            plans.append(MethodPlan(name, info, cfg))
    if scenario is None or calibration is None or len(plans) != len(train.methods):
        return None
    return TrainPlan(scenario, tuple(plans), train.seeds, train.calibrated, calibration, str(path))


def plan_builder(overrides: Overrides) -> Build[TrainPlan | None]:
    """build_plan with these overrides, as walla.manifests.scenario's readers call a stage's builder."""

    def build(raw: dict, path: Path, scenario: Scenario | None, problems: list[str]) -> TrainPlan | None:
        return build_plan(raw, path, scenario, overrides, problems)

    return build


def load_plan(name_or_path: str | Path, overrides: Overrides | None = None) -> TrainPlan:
    """Read, resolve and validate a scenario file's spec and plan.

    Raises:
        ConfigError: every problem of the file (and its includes) at once, each naming file and key.
    """
    plan = parse_scenario(name_or_path, plan_builder(overrides or Overrides()))
    assert plan is not None  # None only alongside problems, which parse_scenario raises
    return plan


def plan_yaml(plan: TrainPlan) -> str:
    """The fully resolved plan as YAML (walla train --show-plan)."""
    return yaml.safe_dump(plan.to_dict(), sort_keys=False, default_flow_style=None, width=110)


def with_spec(plan: TrainPlan, spec: ScenarioSpec) -> TrainPlan:
    """The same plan on another spec (a joined scenario: agents added or dropped)."""
    return dataclasses.replace(plan, scenario=dataclasses.replace(plan.scenario, spec=spec))
