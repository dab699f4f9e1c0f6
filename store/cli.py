"""Command line of the `store` stage (typer): what is in a store, is it intact, remove entries.

walla-store ls [--store walla-store]             feature sets + question tables, sizes, rows, status
walla-store verify [FP_PREFIX ...] [--store ..]  recompute every file checksum; exit 1 naming a bad file
walla-store rm FP_PREFIX [--store ..] [--yes]    delete a feature set / question table by fingerprint prefix
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table
from walla.store import atomic
from walla.store.featureset import (
    FeatureSetInfo,
    LockedError,
    StoreError,
    list_feature_sets,
    read_feature_set,
    remove_feature_set,
    verify_checksums,
)
from walla.store.questions import QUESTIONS_DIR, list_question_tables, read_question_table

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="walla store: list, verify and remove feature sets"
)

STORE_OPT = typer.Option(Path("walla-store"), "--store", help="store directory")


def _console() -> Console:
    # wide enough that fingerprints and paths are never cut when output goes to a file or a test runner
    return Console(width=max(shutil.get_terminal_size((160, 24)).columns, 160), soft_wrap=False)


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


def _entries(store: Path) -> list[_Entry]:
    out = [_Entry("features", i.fingerprint, i.path, info=i) for i in list_feature_sets(store)]
    out += [
        _Entry("questions", m["fingerprint"], Path(m["path"]), meta=m) for m in list_question_tables(store)
    ]
    qroot = store / QUESTIONS_DIR
    for d in sorted(qroot.glob("*/*.incomplete")) if qroot.is_dir() else []:  # a killed question-table write
        out.append(_Entry("questions", d.name.split(".")[0], d))
    return out


@app.command("ls")
def ls(store: Path = STORE_OPT) -> None:
    """List feature sets and question tables: status, rows, hidden size, disk size, creation time."""
    console = _console()
    entries = _entries(store)
    if not entries:
        where = "" if store.is_dir() else " (the directory does not exist)"
        console.print(
            f"store {store} is empty{where}: create feature sets with `make extract MODEL=.. DATASET=..`"
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
        "rows",
        "hidden",
        "size",
        "created",
    ):
        table.add_column(col, no_wrap=True, justify="right" if col in ("rows", "hidden", "size") else "left")
    total, counts = 0, {}
    for e in entries:
        size = atomic.dir_size(e.path)
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
                str(m["n_rows"]),
                "",
                _size(size),
                m.get("created_at", "")[:19],
            )
        else:
            table.add_row(
                "questions", "", e.path.parent.name, "", e.fingerprint, "incomplete", "?", "", _size(size), ""
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
    store: Path = STORE_OPT,
) -> None:
    """Recompute the checksum of every file of every complete entry; exit 1 naming the first bad file."""
    console = _console()
    entries = [
        e for e in _entries(store) if not prefixes or any(e.fingerprint.startswith(p) for p in prefixes)
    ]
    if not entries:
        console.print(
            f"nothing to verify in {store}" + (f" matching {', '.join(prefixes)}" if prefixes else "")
        )
        raise typer.Exit(1 if prefixes else 0)
    failed = 0
    for e in entries:
        label = f"{e.kind} {e.fingerprint} ({e.path})"
        try:
            if e.info is not None and e.info.status in ("incomplete", "writing"):
                console.print(f"[yellow]SKIP[/] {label}: {e.info.status}, not committed")
                continue
            if e.info is not None and e.info.status == "stale":
                verify_checksums(e.path, atomic.read_json(e.path / "meta.json"))
                console.print(f"[yellow]OK  [/] {label}: checksums match, but schema is stale (re-extract)")
                continue
            if e.info is not None:
                read_feature_set(e.path, verify=True)
            elif e.meta is not None:
                read_question_table(store, e.meta["dataset"], e.fingerprint, verify=True)
            else:
                console.print(f"[yellow]SKIP[/] {label}: incomplete write")
                continue
            console.print(f"[green]OK  [/] {label}")
        except (StoreError, ValueError, OSError) as err:
            failed += 1
            console.print(f"[red]FAIL[/] {label}: {err}")
    if failed:
        console.print(f"[red]{failed} of {len(entries)} entries failed verification[/]")
        raise typer.Exit(1)


@app.command("rm")
def rm(
    prefix: str = typer.Argument(..., help="fingerprint prefix (at least 4 characters)"),
    store: Path = STORE_OPT,
    yes: bool = typer.Option(False, "--yes", "-y", help="do not ask for confirmation"),
    all_matches: bool = typer.Option(False, "--all", help="remove every entry the prefix matches"),
) -> None:
    """Remove a feature set (complete or not) or a question table by fingerprint prefix."""
    console = _console()
    if len(prefix) < 4:
        console.print(f"fingerprint prefix {prefix!r} is too short: give at least 4 characters")
        raise typer.Exit(2)
    matches = [e for e in _entries(store) if e.fingerprint.startswith(prefix)]
    if not matches:
        console.print(
            f"no entry of {store} has a fingerprint starting with {prefix!r} (see `walla-store ls`)"
        )
        raise typer.Exit(1)
    if len(matches) > 1 and not all_matches:
        console.print(
            f"{prefix!r} matches {len(matches)} entries: "
            + ", ".join(f"{e.kind} {e.fingerprint}" for e in matches)
            + "; give more characters or --all"
        )
        raise typer.Exit(1)
    for e in matches:
        if not yes and not typer.confirm(f"remove {e.kind} {e.fingerprint} ({e.path})?"):
            continue
        try:
            if e.info is not None:
                remove_feature_set(e.info)
            else:
                doomed = e.path.with_name(e.path.name + ".deleting")
                e.path.rename(doomed)
                shutil.rmtree(doomed)
        except LockedError as err:
            console.print(str(err))
            raise typer.Exit(1) from None
        console.print(f"removed {e.kind} {e.fingerprint} ({e.path})")


def main() -> None:
    app()
