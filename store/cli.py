"""Command line of the `store` stage (typer): what is in a store, is it intact, remove entries.

walla store ls [--store walla-store]             feature sets + question tables, sizes, rows, status
walla store verify [FP_PREFIX ...] [--store ..]  recompute every file checksum; exit 1 naming a bad file
walla store rm FP_PREFIX [--store ..] [--yes]    delete a feature set / question table by fingerprint prefix

`walla-store` is the same command. The store's modules (zarr, polars, fsspec) are imported once, by `_store`,
when a command runs, not for --help (walla.cli.lazy). Errors: one line, the exit codes of cli/exits.py.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table
from walla.cli import new_app
from walla.cli.exits import DATA, USAGE, fail

if TYPE_CHECKING:
    from walla.store.features import FeatureSetInfo
    from walla.store.location import Location

app = new_app(no_args_is_help=True)


@app.callback()
def _group() -> None:
    """List, verify and remove feature sets and question tables."""


def _store() -> ModuleType:
    """The store's modules, imported when a command runs (zarr, polars, fsspec): walla.cli.lazy."""
    import walla.store.commands as ops

    return ops


STORE_OPT = typer.Option(
    "walla-store", "--store", help="store directory, or an fsspec URL (s3://bucket/prefix, file:///dir)"
)


def _console() -> Console:
    # wide enough that fingerprints and paths are never cut when output goes to a file or a test runner
    return Console(width=max(shutil.get_terminal_size((160, 24)).columns, 160), soft_wrap=False)


def _fail(msg: object, code: int = DATA) -> None:
    """`walla store: error: <msg>` on stderr, then exit with `code` (cli/exits.py)."""
    raise fail("store", msg, code)


def _open_store(where: str, must_exist: bool) -> Location:
    """The store at `where` (a directory or an fsspec URL); a file (or, for verify/rm, nothing) is an error."""
    ops = _store()
    try:
        store = ops.as_location(where)
        _check_store(store, must_exist)
    except ValueError as e:  # no fsspec implementation for the protocol, a bad URL (store named)
        _fail(e)
    except OSError as e:
        _fail(f"store {where}: {ops.describe_os_error(e)}")
    return store


def _check_store(store: Location, must_exist: bool) -> None:
    if store.exists() and not store.is_dir():
        _fail(
            f"store {store} is a file, expected a store directory (e.g. walla-store, made by walla extract)"
        )
    if must_exist and not store.exists():
        _fail(f"store {store} does not exist; give the directory walla extract wrote (--store DIR)")


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


@dataclass
class _Entry:
    kind: str  # features | questions
    fingerprint: str
    path: Path
    info: FeatureSetInfo | None = None
    meta: dict | None = None
    error: str | None = None  # a question table whose meta.json cannot be read (file and fix named)


def _entries(store: Path) -> list[_Entry]:
    ops = _store()
    out = [_Entry("features", i.fingerprint, i.path, info=i) for i in ops.list_feature_sets(store)]
    for d in ops.question_table_dirs(store):
        try:
            m = ops.read_question_meta(d)
            out.append(_Entry("questions", m["fingerprint"], d, meta=m))
        except ops.StoreError as e:
            out.append(_Entry("questions", d.name, d, error=str(e)))
    qroot = store / ops.QUESTIONS_DIR
    for d in sorted(qroot.glob("*/*.incomplete")) if qroot.is_dir() else []:  # a killed question-table write
        out.append(_Entry("questions", d.name.split(".")[0], d))
    return out


@app.command("ls")
def ls(store: str = STORE_OPT) -> None:
    """List feature sets and question tables: status, rows, hidden size, disk size, creation time."""
    ops = _store()
    store = _open_store(store, must_exist=False)
    console = _console()
    try:
        entries = _entries(store)
    except (ops.StoreError, OSError) as e:
        _fail(ops.describe_os_error(e) if isinstance(e, OSError) else e)
    if not entries:
        where = "" if store.is_dir() else " (the directory does not exist)"
        console.print(
            f"store {store} is empty{where}: create feature sets with `walla extract --model .. --dataset ..`"
        )
        return
    table = Table(title=f"walla store {store}", show_lines=False)
    for col in (
        "kind",
        "model",
        "dataset",
        "variant",
        "fingerprint",
        "status",
        "tier",
        "rows",
        "hidden",
        "size",
        "created",
    ):
        table.add_column(col, no_wrap=True, justify="right" if col in ("rows", "hidden", "size") else "left")
    total, counts = 0, {}
    for e in entries:
        size = ops.dir_size(e.path)
        total += size
        if e.info is not None:
            i = e.info
            status = i.status if i.status != "stale" else f"stale (schema v{i.schema_version})"
            if i.status in ("incomplete", "writing"):
                rows = f"{i.done_rows or 0}/{i.n_rows if i.n_rows is not None else '?'}"
            else:
                rows = str(i.n_rows)
            counts[i.status] = counts.get(i.status, 0) + 1
            table.add_row(
                "features",
                i.model,
                i.dataset,
                i.variant,
                i.fingerprint,
                status,
                i.tier or "unrecorded",
                rows,
                str(i.hidden_size or "?"),
                _size(size),
                (i.created_at or "")[:19],
            )
        elif e.meta is not None:
            m = e.meta
            table.add_row(
                "questions",
                "",
                m["dataset"],
                "",
                m["fingerprint"],
                "complete",
                "",
                str(m["n_rows"]),
                "",
                _size(size),
                m.get("created_at", "")[:19],
            )
        else:
            table.add_row(
                "questions",
                "",
                e.path.parent.name,
                "",
                e.fingerprint,
                "corrupt" if e.error else "incomplete",
                "",
                "?",
                "",
                _size(size),
                "",
            )
    console.print(table)
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    console.print(
        f"{sum(counts.values())} feature sets ({summary or 'none'}), "
        f"{sum(e.kind == 'questions' for e in entries)} question tables, {_size(total)} in {store}"
    )


@app.command("verify")
def verify(
    prefixes: list[str] = typer.Argument(None, help="fingerprint prefixes to check (default: everything)"),
    store: str = STORE_OPT,
) -> None:
    """Recompute the checksum of every file of every complete entry; exit 1 naming the first bad file."""
    ops = _store()
    store = _open_store(store, must_exist=True)
    console = _console()
    try:
        entries = [
            e for e in _entries(store) if not prefixes or any(e.fingerprint.startswith(p) for p in prefixes)
        ]
    except (ops.StoreError, OSError) as e:
        _fail(ops.describe_os_error(e) if isinstance(e, OSError) else e)
    if not entries:
        if prefixes:
            _fail(
                f"no entry of {store} has a fingerprint starting with {', '.join(prefixes)} (see `walla store ls`)"
            )
        console.print(f"nothing to verify in {store}")
        return
    failed = 0
    for e in entries:
        label = f"{e.kind} {e.fingerprint} ({e.path})"
        try:
            if e.error is not None:
                raise ops.StoreError(e.error)
            if (
                e.info is not None
                and e.info.status in ("incomplete", "writing")
                and (e.path.name.endswith(".incomplete") or ops.is_remote(e.path))  # remote: written in place
            ):
                console.print(f"[yellow]SKIP[/] {label}: {e.info.status}, not committed")
                continue
            if e.info is not None and e.info.status == "stale":
                ops.verify_checksums(e.path, ops.read_json(e.path / "meta.json"))
                console.print(f"[yellow]OK  [/] {label}: checksums match, but schema is stale (re-extract)")
                continue
            if e.info is not None:
                ops.read_feature_set(e.path, verify=True)
            elif e.meta is not None:
                ops.read_question_table(store, e.meta["dataset"], e.fingerprint, verify=True)
            else:
                console.print(f"[yellow]SKIP[/] {label}: incomplete write")
                continue
            console.print(f"[green]OK  [/] {label}")
        except (ops.StoreError, ValueError, OSError) as err:
            failed += 1
            msg = ops.describe_os_error(err) if isinstance(err, OSError) else " ".join(str(err).split())
            typer.echo(f"FAIL {label}: {msg}", err=True)
    if failed:
        console.print(f"[red]{failed} of {len(entries)} entries failed verification[/]")
        raise typer.Exit(1)


@app.command("rm")
def rm(
    prefix: str = typer.Argument(..., help="fingerprint prefix (at least 4 characters)"),
    store: str = STORE_OPT,
    yes: bool = typer.Option(False, "--yes", "-y", help="do not ask for confirmation"),
    all_matches: bool = typer.Option(False, "--all", help="remove every entry the prefix matches"),
) -> None:
    """Remove a feature set (complete or not) or a question table by fingerprint prefix."""
    console = _console()
    if len(prefix) < 4:
        _fail(f"fingerprint prefix {prefix!r} is too short: give at least 4 characters", USAGE)
    ops = _store()
    store = _open_store(store, must_exist=True)
    try:
        matches = [e for e in _entries(store) if e.fingerprint.startswith(prefix)]
    except (ops.StoreError, OSError) as e:
        _fail(ops.describe_os_error(e) if isinstance(e, OSError) else e)
    if not matches:
        _fail(f"no entry of {store} has a fingerprint starting with {prefix!r} (see `walla store ls`)")
    if len(matches) > 1 and not all_matches:
        _fail(
            f"{prefix!r} matches {len(matches)} entries: "
            + ", ".join(f"{e.kind} {e.fingerprint}" for e in matches)
            + "; give more characters or --all",
            USAGE,
        )
    for e in matches:
        if not yes and not typer.confirm(f"remove {e.kind} {e.fingerprint} ({e.path})?"):
            continue
        try:
            if e.info is not None:
                ops.remove_feature_set(e.info)
            else:
                ops.remove_dir(e.path)
        except ops.LockedError as err:
            _fail(err)
        except OSError as err:
            _fail(ops.describe_os_error(err))
        console.print(f"removed {e.kind} {e.fingerprint} ({e.path})")
