"""Where a store lives: a local directory (pathlib.Path: the POSIX path, unchanged and fastest) or any
fsspec URL (`s3://bucket/prefix`, `gs://...`, `memory://...`) as a `RemotePath`.

    root = as_location("walla-store")                 # Path
    root = as_location("file:///data/walla-store")    # Path too: file:// is a local directory
    root = as_location("s3://bucket/walla-store")     # RemotePath over s3fs

A RemotePath offers the few pathlib operations the store uses (`/`, name, parent(s), with_name, exists,
is_dir, is_file, iterdir, read_text, open, unlink, stat, glob), so the store code reads the same for
both. What differs is spelled out where it matters:
- Object stores have no directory rename: a remote feature set / question table is written in place
  and committed by its meta.json, written last (a single PUT appears whole or not at all).
- A file is written locally, then uploaded in one PUT (`upload`): readers never see half of it.
- No flock: one driver per feature set is the user's promise (a Ray run has one driver).
- Hidden states go through zarr's FsspecStore; Parquet is read through pyarrow's fsspec filesystem.
Endpoint and credentials come from the usual places: `AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, ...
(botocore) or `FSSPEC_S3_ENDPOINT_URL` (fsspec's config); nothing here names a service.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from types import SimpleNamespace

import fsspec
import polars as pl
import pyarrow.parquet as pq
from pyarrow.fs import FSSpecHandler, PyFileSystem
from zarr.storage import FsspecStore

# listings are read fresh: other processes (Ray workers) write shards while a driver lists them
FS_OPTIONS = {"use_listings_cache": False}


class RemotePath:
    """A path in an fsspec filesystem: `<protocol>://<path>` (no trailing slash)."""

    def __init__(self, fs, protocol: str, path: str):
        self.fs = fs
        self.protocol = protocol
        self.path = path.rstrip("/")

    # -- pure path algebra -------------------------------------------------------------------------------
    def __str__(self) -> str:
        return f"{self.protocol}://{self.path}"

    def __repr__(self) -> str:
        return f"RemotePath({str(self)!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, RemotePath) and str(other) == str(self)

    def __hash__(self) -> int:
        return hash(str(self))

    def __truediv__(self, other) -> RemotePath:
        return RemotePath(self.fs, self.protocol, f"{self.path}/{str(other).strip('/')}")

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def parent(self) -> RemotePath:
        return RemotePath(self.fs, self.protocol, self.path.rsplit("/", 1)[0] if "/" in self.path else "")

    @property
    def parents(self) -> list[RemotePath]:
        out, p = [], self
        while "/" in p.path:
            p = p.parent
            out.append(p)
        return out

    @property
    def parts(self) -> tuple[str, ...]:
        return (f"{self.protocol}://", *self.path.split("/"))

    def with_name(self, name: str) -> RemotePath:
        return self.parent / name

    def relative_to(self, other: RemotePath) -> PurePosixPath:
        return PurePosixPath(self.path).relative_to(other.path)

    # -- filesystem -----------------------------------------------------------------------------------------
    def exists(self) -> bool:
        return self.fs.exists(self.path)

    def is_dir(self) -> bool:
        return self.fs.isdir(self.path)

    def is_file(self) -> bool:
        return self.fs.isfile(self.path)

    def iterdir(self) -> list[RemotePath]:
        return [self / PurePosixPath(p).name for p in self.fs.ls(self.path, detail=False) if p != self.path]

    def glob(self, pattern: str) -> list[RemotePath]:
        return [RemotePath(self.fs, self.protocol, p) for p in self.fs.glob(f"{self.path}/{pattern}")]

    def read_bytes(self) -> bytes:
        return self.fs.cat_file(self.path)

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def write_bytes(self, data: bytes) -> None:
        self.fs.pipe_file(self.path, data)

    def write_text(self, text: str, encoding: str = "utf-8") -> None:
        self.write_bytes(text.encode(encoding))

    def open(self, mode: str = "rb", **kwargs):
        return self.fs.open(self.path, mode, **kwargs)

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Object stores have no directories: nothing to create (prefixes exist once a key is under them)."""

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self.fs.rm_file(self.path)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def stat(self) -> SimpleNamespace:
        info = self.fs.info(self.path)
        mtime = info.get("LastModified") or info.get("mtime") or info.get("created")
        if hasattr(mtime, "timestamp"):
            mtime = mtime.timestamp()
        return SimpleNamespace(st_size=int(info.get("size") or 0), st_mtime=float(mtime or 0.0))


Location = Path | RemotePath


def as_location(where: str | os.PathLike | RemotePath) -> Location:
    """A store path: RemotePath for a URL with a non-local protocol, else a Path (file:// included)."""
    if isinstance(where, (Path, RemotePath)):
        return where
    text = os.fspath(where)
    if "://" not in text:
        return Path(text)
    protocol = text.split("://", 1)[0]
    if protocol in ("file", "local"):
        return Path(text.split("://", 1)[1])
    try:
        fs, path = fsspec.core.url_to_fs(text, **FS_OPTIONS)
    except ImportError as e:  # e.g. "Install s3fs to access S3": say which store needs it
        raise ValueError(f"store {text}: {e} (pip install 'walla[s3]' for s3://)") from None
    except ValueError as e:  # "Protocol not known: foo"
        raise ValueError(f"store {text}: {e}") from None
    return RemotePath(fs, protocol, path)


def is_remote(p) -> bool:
    return isinstance(p, RemotePath)


def open_binary(p: Location):
    return p.open("rb") if is_remote(p) else open(p, "rb")  # noqa: SIM115 - the caller closes it


def upload(local: Path, dest: RemotePath) -> None:
    """One PUT (multipart for large files, still all-or-nothing): `dest` appears whole or not at all."""
    dest.fs.put_file(str(local), dest.path)


def walk_files(root: Location) -> list[str]:
    """Relative POSIX paths of every file under root, sorted."""
    if is_remote(root):
        base = root.path + "/"
        return sorted(p[len(base) :] for p in root.fs.find(root.path) if p.startswith(base))
    out = []
    for dirpath, _, files in os.walk(root):
        out.extend(Path(dirpath, name).relative_to(root).as_posix() for name in files)
    return sorted(out)


def missing_files(root: Location, rels) -> list[str]:
    """The entries of `rels` that are not files under root (one listing for a remote root)."""
    if is_remote(root):
        have = set(walk_files(root))
        return [rel for rel in rels if rel not in have]
    return [rel for rel in rels if not (root / rel).is_file()]


def subdirs(root: Location) -> list[Location]:
    """Sub-directories of root, sorted by name (none when root is not a directory)."""
    if is_remote(root):
        with contextlib.suppress(FileNotFoundError):
            entries = root.fs.ls(root.path, detail=True)
            return sorted(
                (root / PurePosixPath(e["name"]).name for e in entries if e["type"] == "directory"),
                key=lambda p: p.name,
            )
        return []
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def rmtree(p: Location) -> None:
    """Delete a directory tree if present (remote: every key under the prefix)."""
    if not is_remote(p):
        shutil.rmtree(p, ignore_errors=True)
        return
    with contextlib.suppress(FileNotFoundError):
        if p.fs.find(p.path):
            p.fs.rm(p.path, recursive=True)


def du(root: Location) -> int:
    """Bytes of every file under root."""
    if is_remote(root):
        with contextlib.suppress(FileNotFoundError):
            return int(root.fs.du(root.path, total=True))
        return 0
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(FileNotFoundError):  # a writer renamed it meanwhile
                total += os.stat(os.path.join(dirpath, name)).st_size
    return total


def zarr_store(p: Location, read_only: bool = False):
    """What zarr opens: the local path as a string (zarr's LocalStore), or an FsspecStore for a URL."""
    if not is_remote(p):
        return str(p)
    return FsspecStore.from_url(str(p), storage_options=dict(FS_OPTIONS), read_only=read_only)


def read_parquet_remote(p: RemotePath, columns: list[str] | None = None):
    """A remote Parquet file through pyarrow's fsspec filesystem, as a polars DataFrame."""
    table = pq.read_table(p.path, filesystem=PyFileSystem(FSSpecHandler(p.fs)), columns=columns)
    return pl.from_arrow(table)


def parquet_columns(p: Location) -> list[str]:
    if not is_remote(p):
        return pl.read_parquet_schema(p).names()
    with p.open("rb") as f:
        return pq.read_schema(f).names


def write_via_local(dest: RemotePath, write) -> None:
    """Run `write(tmp)` on a local temp file named like dest, then upload it in one PUT."""
    with tempfile.TemporaryDirectory(prefix="walla-upload-") as d:
        tmp = Path(d) / dest.name
        write(tmp)
        upload(tmp, dest)
