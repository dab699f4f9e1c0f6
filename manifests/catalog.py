"""The model and dataset tables: manifests/models.yaml and manifests/datasets.yaml as checked configs.

    models = load_models()        # name -> ModelEntry
    datasets = load_datasets()    # name -> DatasetEntry

Every problem of a file (unknown or missing keys, wrong types, bad choices) is collected and raised as
ONE ConfigError naming the file and key (walla.manifests.validate). The extract stage reads these
tables to load a model and a dataset; a scenario file's references are checked against them
(walla.manifests.scenario). A dataset's `loader:` and a model's `backend:` are any name here: the extract
stage's registries (extract/datasets/registry.py, extract/backends/registry.py) are the one list of each and
reject an unknown one, naming the model (this layer imports no stage).
"""

from __future__ import annotations

import difflib
import hashlib
from dataclasses import field
from pathlib import Path
from typing import Literal

from walla.manifests.validate import ConfigError, check, collect, config
from walla.manifests.yaml_io import manifests_dir, read_yaml

SPLIT_MODES = ("uniform", "balanced_binary", "none", "given")


@config
class ModelEntry:
    name: str
    source: Literal["hub", "package", "local"]
    hidden_size: int | None  # H of the last-layer hidden state (checked against the store); None: ad hoc
    hub_id: str | None = None  # source=hub: "org/name"
    revision: str = "main"  # hub commit/tag; the resolved commit sha is recorded at extraction
    package: str | None = None  # source=package: importable module that ships the GGUF
    gguf: str | None = None  # glob inside the package dir, "assemble()" (gemma3 package), or a hub filename
    path: str | None = None  # source=local: directory or GGUF file
    backend: str = "hf"  # hint: a registered backend (checked by extract's registry, as `loader` is)
    backend_args: dict = field(default_factory=dict)  # that backend's --backend-arg defaults (its Options)
    dtype: Literal["auto", "bfloat16", "float32", "float16"] = "auto"  # reference: float32
    trust_remote_code: bool = False
    chat_template: bool = False  # the reference never applies one (SPEC §1.1)

    def __post_init__(self) -> None:
        check(self.hidden_size is None or self.hidden_size > 0, "hidden_size", "> 0", self.hidden_size)
        need = {"hub": "hub_id", "package": "package", "local": "path"}[self.source]
        check(bool(getattr(self, need)), need, f"set for source {self.source!r}", getattr(self, need))
        if self.source == "package":
            check(bool(self.gguf), "gguf", "a glob inside the package, or 'assemble()'", self.gguf)


@config
class DatasetEntry:
    name: str
    loader: str  # an extract loader (extract/datasets/registry.py; checked there, with close matches)
    split_protocol: dict  # {mode, ratios, seed} (SPEC §3.1)
    hub: dict | None = None  # {path, name, split, revision}
    local_format: Literal["hub", "original"] | None = None  # format of a local DATA_FILE (None: detect)
    option_tokens: list[str] | None = None  # None: letters A, B, ... by position
    soft_target: bool = False  # gold_dist is the target (BayesX posterior)
    has_context: bool = False  # relevant / irrelevant prompt variants exist
    generator: dict | None = None  # {n, seed, ...} for generated datasets
    prompt: str | None = None  # prompt template name (None: the loader's default)

    def __post_init__(self) -> None:
        sp = self.split_protocol
        unknown = sorted(set(sp) - {"mode", "ratios", "seed"})
        check(not unknown, "split_protocol", "keys among mode, ratios, seed", unknown)
        check(sp.get("mode") in SPLIT_MODES, "split_protocol.mode", " | ".join(SPLIT_MODES), sp.get("mode"))
        ratios = sp.setdefault("ratios", [0.8, 0.1, 0.1])
        ok = (
            isinstance(ratios, list)
            and len(ratios) == 3
            and all(isinstance(r, int | float) and r >= 0 for r in ratios)
            and abs(sum(ratios) - 1) < 1e-9
        )
        check(ok, "split_protocol.ratios", "3 non-negative numbers summing to 1", ratios)
        seed = sp.get("seed", 0)
        check(isinstance(seed, int) and not isinstance(seed, bool), "split_protocol.seed", "an int", seed)
        if self.hub is not None:
            unknown = sorted(set(self.hub) - {"path", "name", "split", "revision"})
            check(not unknown, "hub", "keys among path, name, split, revision", unknown)
            for k in ("path", "split"):
                check(isinstance(self.hub.get(k), str), f"hub.{k}", "a string", self.hub.get(k))
        if self.soft_target:
            check(self.option_tokens is not None, "option_tokens", "explicit with soft_target", None)


def _table_file(path: Path | None, default_name: str) -> Path:
    if path is None:
        return manifests_dir() / default_name
    path = Path(path)
    return path / default_name if path.is_dir() else path


def _entries(cls: type, file: Path, problems: list[str]) -> dict:
    out = {}
    for name, raw in read_yaml(file, problems).items():
        where = f"{file}: {name}"
        if not isinstance(raw, dict):
            problems.append(f"{where}: expected a mapping of fields, got {raw!r}")
            continue
        tokens = raw.get("option_tokens")
        if isinstance(tokens, list) and any(isinstance(t, bool) for t in tokens):
            for i, t in enumerate(tokens):  # YAML 1.1 reads YES/NO/yes/no/on/off as booleans
                if isinstance(t, bool):
                    problems.append(
                        f'{where}.option_tokens[{i}]: {t!r} is a YAML boolean; quote it, e.g. "YES"'
                    )
            continue
        entry = collect(cls, {**raw, "name": str(name)}, where, problems)
        if entry is not None:
            out[str(name)] = entry
    return out


def _load(cls: type, path: Path | None, default_name: str) -> dict:
    problems: list[str] = []
    out = _entries(cls, _table_file(path, default_name), problems)
    if problems:
        raise ConfigError(problems)
    return out


def load_models(path: Path | None = None) -> dict[str, ModelEntry]:
    """models.yaml (default: the package's) -> {name: ModelEntry}. Raises ConfigError."""
    return _load(ModelEntry, path, "models.yaml")


def load_datasets(path: Path | None = None) -> dict[str, DatasetEntry]:
    """datasets.yaml (default: the package's) -> {name: DatasetEntry}. Raises ConfigError."""
    return _load(DatasetEntry, path, "datasets.yaml")


def collect_tables(directory: Path | None, problems: list[str]) -> tuple[dict, dict]:
    """(models, datasets) of a manifests directory, problems appended instead of raised."""
    d = Path(directory) if directory else manifests_dir()
    return _entries(ModelEntry, d / "models.yaml", problems), _entries(
        DatasetEntry, d / "datasets.yaml", problems
    )


def _slug(text: str) -> str:
    """A store-safe name: [a-z0-9._-] only, no leading dot (no path escapes)."""
    out = "".join(c if c.isalnum() or c in "._-" else "-" for c in text.lower()).strip(".-")
    return out[:60] or "model"


def resolve_model_name(name: str, models: dict[str, ModelEntry]) -> tuple[str, ModelEntry]:
    """(store name, entry) of `--model`: a models.yaml name, `hf:org/name[@revision]`, a local model
    directory, or a local `.gguf` file. Ad-hoc models get a derived, path-safe store name; their hidden
    size is read from the model at load time.

    Raises:
        KeyError: an unknown name that is neither a hub reference nor an existing path.
    """
    if name in models:
        return name, models[name]
    if name.startswith("hf:"):
        ref, _, rev = name[3:].partition("@")
        if ref.count("/") != 1 or not all(ref.split("/")):
            raise KeyError(f"--model {name!r}: expected hf:ORG/NAME[@REVISION]")
        store_name = "hf-" + _slug(ref.replace("/", "--")) + (f"-{_slug(rev)[:12]}" if rev else "")
        return store_name, ModelEntry(
            name=store_name, source="hub", hub_id=ref, revision=rev or "main", hidden_size=None
        )
    path = Path(name).expanduser()
    if path.is_dir() or (path.is_file() and path.suffix == ".gguf"):
        full = str(path.resolve())
        store_name = f"{_slug(path.stem)}-{hashlib.sha256(full.encode()).hexdigest()[:8]}"
        return store_name, ModelEntry(name=store_name, source="local", path=full, hidden_size=None)
    close = difflib.get_close_matches(name, list(models), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise KeyError(
        f"unknown model {name!r}{hint} (a models.yaml name: {', '.join(sorted(models))}; or hf:ORG/NAME[@REV], "
        "a local model directory, or a .gguf file)"
    )
