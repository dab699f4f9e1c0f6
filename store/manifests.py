"""Manifests: the YAML files under `manifests/` (models, datasets, scenarios) loaded into checked dataclasses.

    models = load_models()                      # manifests/models.yaml    name -> ModelEntry
    datasets = load_datasets()                  # manifests/datasets.yaml  name -> DatasetEntry
    entry = load_scenario("demo-hetero-facts")  # manifests/scenarios/<name>.yaml, or any path to a YAML file

Rules (STYLE items 3-4): unknown keys are errors; every problem of a file (unknown/missing keys, wrong
types, references to unknown models/datasets/methods) is collected and raised as ONE ManifestError
naming the file and key. A scenario may `include:` other YAML files (relative to itself, e.g.
`_base.yaml`): included keys come first, the file's own keys win, and nested mappings (hparams) merge.

Scenario `hparams` keys are method names or method *families* (the module a method lives in:
"walla" covers walla-i, walla-ii, walla-i-log, walla-i-cal; "route-llm" covers route-llm and
route-llm-ctx). Resolution per method: family keys < the registry's defaults for that method (what
makes walla-i-log a log-pool method) < keys given under the method's own name. The loaded entry holds
one resolved dict per method of `methods`.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

MANIFEST_PACKAGE = "walla.manifests"
SOURCES = ("hub", "package", "local")
BACKENDS = ("hf", "vllm")
DTYPES = ("auto", "bfloat16", "float32", "float16")
LOADERS = ("pubmedqa", "medmcqa", "mmlu", "arc", "bayesx", "facts", "jsonl")  # extract/datasets.py LOADERS
GENERATED = ("bayesx", "facts")  # loaders that need a `generator:` block
SPLIT_MODES = ("uniform", "balanced_binary", "none", "given")
CONTEXT_RULES = ("none", "one_relevant", "one_relevant_one_irrelevant")


class ManifestError(ValueError):
    """Every problem found in one load, one per line ('<file>: <key>: <what is wrong>')."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        n = len(self.problems)
        super().__init__(
            f"{n} problem{'s' if n > 1 else ''} in manifests:\n" + "\n".join(f"  - {p}" for p in problems)
        )


@dataclass(frozen=True)
class ModelEntry:
    name: str
    source: str  # hub | package | local
    hidden_size: int  # H of the last-layer hidden state (checked against the store)
    hub_id: str | None = None  # source=hub: "org/name"
    revision: str = "main"  # hub commit/tag; "main" unless a pinned one is known
    package: str | None = None  # source=package: importable module that ships the GGUF
    gguf: str | None = None  # glob inside the package dir, "assemble()" (gemma3 package), or a hub filename
    path: str | None = None  # source=local: directory or GGUF file
    backend: str = "hf"  # hint: hf (transformers, CPU/GPU) | vllm (GPU)
    dtype: str = "auto"  # auto | bfloat16 | float32 | float16 (reference: float32)
    trust_remote_code: bool = False
    chat_template: bool = False  # the reference never applies one (SPEC §1.1)


@dataclass(frozen=True)
class DatasetEntry:
    name: str
    loader: str  # extract loader registry name
    split_protocol: dict  # {mode, ratios, seed}
    hub: dict | None = None  # {path, name, split}
    local_format: str | None = None  # format of a local DATA_FILE (None: detect from the path)
    option_tokens: list[str] | None = None  # None: letters A, B, ... by position
    soft_target: bool = False  # gold_dist is the target (BayesX posterior)
    has_context: bool = False  # relevant / irrelevant prompt variants exist
    generator: dict | None = None  # {n, seed, ...} for generated datasets
    prompt: str | None = None  # prompt template name (None: the loader's default)


@dataclass(frozen=True)
class ScenarioEntry:
    name: str
    dataset: str  # train/val/test rows (test too, unless eval_dataset is set)
    agents: list[str]  # model name per slot (M = len)
    methods: list[str]  # method registry names
    seeds: list[int]
    description: str
    context_rule: str = "none"  # none | one_relevant | one_relevant_one_irrelevant
    context_seed: int = 0  # seeds the per-split context assignment
    eval_dataset: str | None = None  # OOD: every row of this dataset is test
    hparams: dict = field(default_factory=dict)  # method -> resolved hyper-parameter dict
    calibrated: bool = False
    source: str = ""  # the YAML file it came from

    @property
    def n_agents(self) -> int:
        return len(self.agents)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------------------
# file handling


def manifests_dir() -> Path:
    """The installed `walla.manifests` package directory (the repo's manifests/ in an editable install)."""
    return Path(str(resources.files(MANIFEST_PACKAGE)))


def _read_yaml(path: Path, problems: list[str], seen: tuple[Path, ...] = ()) -> dict:
    """Parse one YAML mapping, resolving `include:` (relative to the file) with deep merge."""
    if path in seen:
        problems.append(f"{path}: include cycle via {' -> '.join(p.name for p in (*seen, path))}")
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        problems.append(f"{path}: file not found")
        return {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        problems.append(f"{path}:{where}: not valid YAML ({getattr(e, 'problem', e)})")
        return {}
    if data is None:
        data = {}
    if not isinstance(data, dict):
        problems.append(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
        return {}
    inc = data.pop("include", None)
    if inc is None:
        return data
    merged: dict = {}
    for name in [inc] if isinstance(inc, str) else inc if isinstance(inc, list) else [None]:
        if not isinstance(name, str):
            problems.append(f"{path}: include: expected a file name or a list of them, got {inc!r}")
            continue
        merged = _merge(merged, _read_yaml((path.parent / name).resolve(), problems, (*seen, path)))
    return _merge(merged, data)


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# ---------------------------------------------------------------------------------------------------------
# generic field checking against the dataclass annotations


def _type_ok(value: Any, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    if origin is list:
        (inner,) = typing.get_args(tp)
        return isinstance(value, list) and all(_type_ok(v, inner) for v in value)
    if tp is dict or origin is dict:
        return isinstance(value, dict)
    return True


def _type_name(tp: Any) -> str:
    return str(tp).replace("typing.", "").replace("<class '", "").replace("'>", "")


def _fields(cls, raw: dict, where: str, problems: list[str], fixed: dict) -> dict | None:
    """Keyword arguments for `cls` from `raw`; unknown/missing/mistyped keys are appended to problems."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in fixed}
    n_before = len(problems)
    for k in raw:
        if k not in fields:
            close = difflib.get_close_matches(str(k), fields, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"{where}: unknown key {k!r}{hint}; allowed: {', '.join(fields)}")
    for name, f in fields.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if name not in raw:
            if required:
                problems.append(f"{where}: missing required key {name!r}")
            continue
        if not _type_ok(raw[name], hints[name]):
            problems.append(f"{where}.{name}: expected {_type_name(hints[name])}, got {raw[name]!r}")
    if len(problems) > n_before:
        return None
    return {**{k: v for k, v in raw.items() if k in fields}, **fixed}


def _choice(value: Any, allowed: tuple[str, ...], where: str, problems: list[str]) -> None:
    if value not in allowed:
        close = difflib.get_close_matches(str(value), allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append(f"{where}: {value!r} is not one of {', '.join(allowed)}{hint}")


def _ref(value: Any, known: dict | list, what: str, where: str, problems: list[str]) -> None:
    if value not in known:
        close = difflib.get_close_matches(str(value), list(known), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append(f"{where}: unknown {what} {value!r}{hint}; available: {', '.join(known)}")


# ---------------------------------------------------------------------------------------------------------
# models and datasets


def _table_file(path: Path | None, default_name: str) -> Path:
    if path is None:
        return manifests_dir() / default_name
    path = Path(path)
    return path / default_name if path.is_dir() else path


def _entries(file: Path, problems: list[str]) -> dict:
    data = _read_yaml(file, problems)
    for name, raw in list(data.items()):
        if not isinstance(raw, dict):
            problems.append(f"{file}: {name}: expected a mapping of fields, got {raw!r}")
            data.pop(name)
    return data


def _check_models(file: Path, problems: list[str]) -> dict[str, ModelEntry]:
    out = {}
    for name, raw in _entries(file, problems).items():
        where = f"{file}: {name}"
        n0 = len(problems)
        kw = _fields(ModelEntry, raw, where, problems, {"name": str(name)})
        if kw is None:
            continue
        _choice(kw["source"], SOURCES, f"{where}.source", problems)
        _choice(kw.get("backend", "hf"), BACKENDS, f"{where}.backend", problems)
        _choice(kw.get("dtype", "auto"), DTYPES, f"{where}.dtype", problems)
        need = {"hub": "hub_id", "package": "package", "local": "path"}.get(kw["source"])
        if need and not kw.get(need):
            problems.append(f"{where}: source {kw['source']!r} needs {need!r}")
        if kw["source"] == "package" and not kw.get("gguf"):
            problems.append(
                f"{where}: source 'package' needs 'gguf' (a glob inside the package, or 'assemble()')"
            )
        if kw["hidden_size"] <= 0:
            problems.append(f"{where}.hidden_size: must be > 0, got {kw['hidden_size']}")
        if len(problems) == n0:
            out[str(name)] = ModelEntry(**kw)
    return out


def _check_datasets(file: Path, problems: list[str]) -> dict[str, DatasetEntry]:
    out = {}
    for name, raw in _entries(file, problems).items():
        where = f"{file}: {name}"
        n0 = len(problems)
        tokens = raw.get("option_tokens")
        if isinstance(tokens, list) and any(isinstance(t, bool) for t in tokens):
            for i, t in enumerate(tokens):
                if isinstance(t, bool):  # YAML 1.1 reads YES/NO/yes/no/on/off as booleans
                    problems.append(
                        f'{where}.option_tokens[{i}]: {t!r} is a YAML boolean; quote it, e.g. "YES"'
                    )
            raw = {
                **raw,
                "option_tokens": [str(t) for t in tokens],
            }  # reported once, not again as a type error
        kw = _fields(DatasetEntry, raw, where, problems, {"name": str(name)})
        if kw is None:
            continue
        _choice(kw["loader"], LOADERS, f"{where}.loader", problems)
        sp = kw["split_protocol"]
        for k in sp:
            if k not in ("mode", "ratios", "seed"):
                problems.append(f"{where}.split_protocol: unknown key {k!r}; allowed: mode, ratios, seed")
        _choice(sp.get("mode"), SPLIT_MODES, f"{where}.split_protocol.mode", problems)
        ratios = sp.setdefault("ratios", [0.8, 0.1, 0.1])
        if not (
            _type_ok(ratios, list[float])
            and len(ratios) == 3
            and abs(sum(ratios) - 1) < 1e-9
            and min(ratios) >= 0
        ):
            problems.append(
                f"{where}.split_protocol.ratios: expected 3 non-negative numbers summing to 1, got {ratios!r}"
            )
        if not _type_ok(sp.get("seed", 0), int):
            problems.append(f"{where}.split_protocol.seed: expected int, got {sp.get('seed')!r}")
        hub = kw.get("hub")
        if hub is not None:
            for k in hub:
                if k not in ("path", "name", "split"):
                    problems.append(f"{where}.hub: unknown key {k!r}; allowed: path, name, split")
            for k in ("path", "split"):
                if not isinstance(hub.get(k), str):
                    problems.append(f"{where}.hub.{k}: expected a string, got {hub.get(k)!r}")
        if kw["loader"] in GENERATED and not kw.get("generator"):
            problems.append(f"{where}: loader {kw['loader']!r} needs a generator: {{n, seed}} block")
        if kw.get("soft_target") and kw.get("option_tokens") is None:
            problems.append(f"{where}: soft_target needs explicit option_tokens (the order of gold_dist)")
        if len(problems) == n0:
            out[str(name)] = DatasetEntry(**kw)
    return out


def _raise(problems: list[str]) -> None:
    if problems:
        raise ManifestError(problems)


def load_models(path: Path | None = None) -> dict[str, ModelEntry]:
    """models.yaml (default: the package's) -> {name: ModelEntry}. Raises ManifestError."""
    problems: list[str] = []
    out = _check_models(_table_file(path, "models.yaml"), problems)
    _raise(problems)
    return out


def load_datasets(path: Path | None = None) -> dict[str, DatasetEntry]:
    """datasets.yaml (default: the package's) -> {name: DatasetEntry}. Raises ManifestError."""
    problems: list[str] = []
    out = _check_datasets(_table_file(path, "datasets.yaml"), problems)
    _raise(problems)
    return out


# ---------------------------------------------------------------------------------------------------------
# scenarios


def _method_registry() -> dict:
    """The method registry (lazy import: it is a plain dict of names; nothing heavy is imported).

    This is the one place the store reads a name list owned by `train`: scenario manifests name methods.
    """
    from walla.train.methods import REGISTRY

    return REGISTRY


def method_family(info) -> str:
    """'walla.train.methods.route_llm' -> 'route-llm' (the module a method lives in)."""
    return info.path.rsplit(".", 1)[-1].replace("_", "-")


def _looks_numeric(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _resolve_hparams(raw: dict, methods: list[str], where: str, problems: list[str]) -> dict[str, dict]:
    registry = _method_registry()
    families: dict[str, list[str]] = {}
    for name, info in registry.items():
        families.setdefault(method_family(info), []).append(name)
    for key, val in raw.items():
        if key not in registry and key not in families:
            close = difflib.get_close_matches(str(key), [*registry, *families], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(
                f"{where}.hparams: unknown method or family {key!r}{hint}; families: {', '.join(families)}"
            )
        elif not isinstance(val, dict):
            problems.append(f"{where}.hparams.{key}: expected a mapping of hyper-parameters, got {val!r}")
        else:
            for k, v in val.items():
                if isinstance(v, str) and _looks_numeric(v):  # PyYAML reads 5e-7 (no dot) as a string
                    problems.append(
                        f"{where}.hparams.{key}.{k}: {v!r} is a string; write it as a float, e.g. 5.0e-7"
                    )
    out = {}
    for m in methods:
        if m not in registry:
            continue
        info = registry[m]
        fam = method_family(info)
        resolved = dict(raw.get(fam) or {}) if isinstance(raw.get(fam), dict) else {}
        resolved.update(info.defaults)
        if m != fam and isinstance(raw.get(m), dict):
            resolved.update(raw[m])
        out[m] = resolved
    return out


def list_scenarios(directory: Path | None = None) -> list[str]:
    """Names of the scenario manifests (files starting with '_' are shared fragments, not scenarios)."""
    d = Path(directory) if directory else manifests_dir() / "scenarios"
    return sorted(p.stem for p in d.glob("*.yaml") if not p.name.startswith("_"))


def scenario_path(name_or_path: str | Path, directory: Path | None = None) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return p
    d = Path(directory) if directory else manifests_dir() / "scenarios"
    return d / f"{name_or_path}.yaml"


def load_scenario(
    name_or_path: str | Path,
    *,
    models: dict[str, ModelEntry] | None = None,
    datasets: dict[str, DatasetEntry] | None = None,
) -> ScenarioEntry:
    """A scenario by name (manifests/scenarios/<name>.yaml of the installed package) or by path.

    Args:
        name_or_path: scenario name or path to a YAML file.
        models, datasets: the tables references are checked against (default: the package's).
    Raises:
        ManifestError: every problem of the file at once (unknown scenario names list the available ones).
    """
    path = scenario_path(name_or_path)
    if not path.exists():
        avail = list_scenarios()
        close = difflib.get_close_matches(str(name_or_path), avail, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ManifestError(
            [f"{path}: no such scenario {str(name_or_path)!r}{hint}; available: {', '.join(avail)}"]
        )
    problems: list[str] = []
    models = models if models is not None else _check_models(manifests_dir() / "models.yaml", problems)
    datasets = (
        datasets if datasets is not None else _check_datasets(manifests_dir() / "datasets.yaml", problems)
    )
    entry = _check_scenario(path, models, datasets, problems)
    _raise(problems)
    return entry


def _check_scenario(path: Path, models: dict, datasets: dict, problems: list[str]) -> ScenarioEntry | None:
    raw = _read_yaml(path, problems)
    name = path.stem
    where = str(path)
    if "name" in raw:
        if raw["name"] != name:
            problems.append(
                f"{where}: name {raw['name']!r} differs from the file name {name!r}; drop the key"
            )
        raw.pop("name")
    n0 = len(problems)
    kw = _fields(ScenarioEntry, raw, where, problems, {"name": name, "source": str(path)})
    if kw is None:
        return None
    _ref(kw["dataset"], datasets, "dataset", f"{where}: dataset", problems)
    if kw.get("eval_dataset") is not None:
        _ref(kw["eval_dataset"], datasets, "dataset", f"{where}: eval_dataset", problems)
    if not kw["agents"]:
        problems.append(f"{where}: agents: needs at least one model")
    for i, a in enumerate(kw["agents"]):
        _ref(a, models, "model", f"{where}: agents[{i}]", problems)
    rule = kw.get("context_rule", "none")
    _choice(rule, CONTEXT_RULES, f"{where}: context_rule", problems)
    if rule != "none":
        for key in ("dataset", "eval_dataset"):
            ds = datasets.get(kw.get(key))
            if ds is not None and not ds.has_context:
                problems.append(
                    f"{where}: context_rule {rule!r} needs a dataset with contexts; "
                    f"{key} {ds.name!r} has has_context: false"
                )
    if rule == "one_relevant_one_irrelevant" and len(kw["agents"]) < 2:
        problems.append(f"{where}: context_rule {rule!r} needs at least 2 agents")
    registry = _method_registry()
    if not kw["methods"]:
        problems.append(f"{where}: methods: needs at least one method")
    for i, m in enumerate(kw["methods"]):
        _ref(m, registry, "method", f"{where}: methods[{i}]", problems)
    if len(set(kw["methods"])) != len(kw["methods"]):
        problems.append(
            f"{where}: methods: listed twice: {sorted({m for m in kw['methods'] if kw['methods'].count(m) > 1})}"
        )
    if not kw["seeds"] or len(set(kw["seeds"])) != len(kw["seeds"]):
        problems.append(f"{where}: seeds: expected a non-empty list of distinct ints, got {kw['seeds']!r}")
    kw["hparams"] = _resolve_hparams(kw.get("hparams", {}), kw["methods"], where, problems)
    if len(problems) > n0:
        return None
    return ScenarioEntry(**kw)


def validate_all(directory: Path | None = None) -> list[str]:
    """Load every manifest under `directory` (default: the package's); return all problems (empty = valid)."""
    d = Path(directory) if directory else manifests_dir()
    problems: list[str] = []
    models = _check_models(d / "models.yaml", problems)
    datasets = _check_datasets(d / "datasets.yaml", problems)
    for name in list_scenarios(d / "scenarios"):
        _check_scenario(d / "scenarios" / f"{name}.yaml", models, datasets, problems)
    return problems
