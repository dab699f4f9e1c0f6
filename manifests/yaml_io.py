"""Reading manifest YAML files: `include:` (the one inheritance mechanism) and deep merge.

    raw = read_yaml(Path("my-scenario.yaml"), problems)               # a file and its includes
    raw = with_includes({"include": ["_base.yaml", "_demo.yaml"]}, here, problems)   # presets only

A file may say `include: _base.yaml` or `include: [_base.yaml, _hetero.yaml]` (lm-eval task files do the
same): included files are read first, in order, then the file's own keys win; nested mappings merge key
by key. An included name is looked up next to the including file, then in the project's
`manifests/scenarios/` — and nowhere else: no absolute paths, no `..`, so a scenario file can never read
an arbitrary file on disk. Every problem (missing file, bad YAML, include cycle) is appended to
`problems` as one line naming the file.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path, PurePosixPath

import yaml

MANIFEST_PACKAGE = "walla.manifests"


def manifests_dir() -> Path:
    """The installed `walla.manifests` package directory (the repo's manifests/ in an editable install)."""
    return Path(str(resources.files(MANIFEST_PACKAGE)))


def scenarios_dir() -> Path:
    """The project's scenario files and their shared fragments (`_*.yaml`)."""
    return manifests_dir() / "scenarios"


def _include_path(name: str, including: Path, problems: list[str]) -> Path | None:
    pure = PurePosixPath(name)
    if pure.is_absolute() or ".." in pure.parts or "\\" in name:
        problems.append(
            f"{including}: include: {name!r} must be a file name next to this file or in the project's "
            "manifests/scenarios/ (no absolute paths, no '..')"
        )
        return None
    for base in (including.parent, scenarios_dir()):
        cand = base / pure
        if cand.is_file():
            return cand.resolve()
    problems.append(f"{including}: include: {name!r} not found next to the file nor in {scenarios_dir()}")
    return None


def merge(base: dict, over: dict) -> dict:
    """Deep merge: keys of `over` win; nested mappings merge key by key."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _read_mapping(path: Path, problems: list[str]) -> dict:
    """One YAML file's top-level mapping as written (its `include:` not yet resolved)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        problems.append(f"{path}: file not found")
        return {}
    except IsADirectoryError:
        problems.append(f"{path}: is a directory, expected a YAML file")
        return {}
    except UnicodeDecodeError as e:
        problems.append(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})")
        return {}
    except OSError as e:
        problems.append(f"{path}: cannot read ({e.strerror})")
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
    return data


def read_yaml(path: Path, problems: list[str], seen: tuple[Path, ...] = ()) -> dict:
    """Parse one YAML mapping, resolving `include:`; problems are appended, never raised."""
    path = Path(path)
    if path in seen:
        problems.append(f"{path}: include cycle via {' -> '.join(p.name for p in (*seen, path))}")
        return {}
    return with_includes(_read_mapping(path, problems), path, problems, seen)


def with_includes(data: dict, path: Path, problems: list[str], seen: tuple[Path, ...] = ()) -> dict:
    """`data` (the mapping of the file at `path`) merged over the files its `include:` names, in order."""
    data = dict(data)
    inc = data.pop("include", None)
    if inc is None:
        return data
    names = [inc] if isinstance(inc, str) else inc if isinstance(inc, list) else [None]
    merged: dict = {}
    for name in names:
        if not isinstance(name, str):
            problems.append(f"{path}: include: expected a file name or a list of them, got {inc!r}")
            continue
        target = _include_path(name, path, problems)
        if target is not None:
            merged = merge(merged, read_yaml(target, problems, (*seen, path)))
    return merge(merged, data)
