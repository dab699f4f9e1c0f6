"""Lazy command groups: a subcommand's module is imported when that subcommand runs, not to print help.

    ROOT = typer.Typer(cls=lazy_group({"train": Lazy("walla.train.cli:app", "Fit every method x seed.")}))

This is the one place where walla imports inside a function on purpose (STYLE "A CLI answers at once"):
torch, transformers, Lightning, FastAPI and SQLAlchemy take seconds to import, and `walla --help` or
`walla market --help` needs none of them. Import cycles are caught by tests/test_imports.py, not by
where an import statement sits. A stage's cli.py follows the same rule one level down: its module
imports typer only, and its command imports the stage's config and recipe when it runs.

`run` is how every walla command line runs (the root, `walla-train` and the other aliases, in-process
tests): click's usage errors become one line on stderr and exit 2.
"""

from __future__ import annotations

import difflib
import importlib
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup
from typer.exceptions import TyperException


@dataclass(frozen=True)
class Lazy:
    """One subcommand, named without importing it."""

    target: str  # "module:attr": a typer app (one command or a group) or a click command
    help: str  # its one-line help, shown by the parent's --help (tests/cli: equal to the command's own)
    command: str | None = None  # the target is a group: mount only this command of it


def load(entry: Lazy) -> Any:
    """The click command `entry` names; imports its module (the deferred import of this pattern)."""
    module, _, attr = entry.target.partition(":")
    obj = getattr(importlib.import_module(module), attr)
    cmd = typer.main.get_command(obj) if isinstance(obj, typer.Typer) else obj
    if entry.command is not None:
        cmd = cmd.commands[entry.command]
    return cmd


class LazyGroup(TyperGroup):
    """A typer group whose `lazy` commands are loaded on first use; help and completion list them as named."""

    lazy: Mapping[str, Lazy] = {}
    _listing = False  # True while help or completion lists the commands: no module is imported then

    def list_commands(self, ctx: typer.Context) -> list[str]:
        return [*super().list_commands(ctx), *(n for n in self.lazy if n not in self.commands)]

    def get_command(self, ctx: typer.Context, cmd_name: str) -> Any:
        if cmd_name in self.commands or cmd_name not in self.lazy:
            return super().get_command(ctx, cmd_name)
        if self._listing:
            return TyperCommand(cmd_name, help=self.lazy[cmd_name].help)
        self.commands[cmd_name] = load(self.lazy[cmd_name])
        return self.commands[cmd_name]

    def format_help(self, ctx: typer.Context, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False

    def shell_complete(self, ctx: typer.Context, incomplete: str) -> list:
        self._listing = True
        try:
            return super().shell_complete(ctx, incomplete)
        finally:
            self._listing = False

    def resolve_command(self, ctx: typer.Context, args: list[str]) -> Any:
        try:
            return super().resolve_command(ctx, args)
        except TyperException as e:  # "No such command": typer suggests from loaded commands only
            close = difflib.get_close_matches(args[0], self.list_commands(ctx), n=1) if args else []
            if close and "Did you mean" not in e.message:
                e.message = f"{e.message.rstrip('.')}. Did you mean {close[0]!r}?"
            raise


def lazy_group(commands: Mapping[str, Lazy]) -> type[LazyGroup]:
    """A LazyGroup class holding `commands` (typer builds the group from a class: `Typer(cls=...)`)."""
    return type("LazyGroup", (LazyGroup,), {"lazy": dict(commands)})


def run(command: typer.Typer | Any, argv: Sequence[str], prog: str) -> int:
    """Run a typer app or click command with one-line usage errors (exit 2); returns the exit code."""
    if isinstance(command, typer.Typer):
        command = typer.main.get_command(command)
    try:
        rv = command.main(args=list(argv), prog_name=prog, standalone_mode=False)
    except TyperException as e:  # click's usage errors (typer vendors click); .ctx names the subcommand
        message = " ".join(e.format_message().split())
        if message:  # empty: no arguments at all, and click printed the help already
            ctx = getattr(e, "ctx", None)
            where = ctx.command_path if ctx is not None else prog
            typer.echo(f"{where}: error: {message} (see {where} --help)", err=True)
        return e.exit_code
    except (KeyboardInterrupt, EOFError):
        return 130
    return rv if isinstance(rv, int) else 0


def door(package: str, rooms: Mapping[str, Sequence[str]]) -> tuple[Any, list[str]]:
    """A package door's lazy exports (PEP 562): `__getattr__, __all__ = door(__name__, _ROOMS)`.

    `rooms` maps each private room (`_layout`) to the public names it defines; a name loads its room when it
    is first asked for, so a door never imports torch for `--help` (the same deferred import as `load`), and
    is then kept in the package's namespace: a later `from door import name` (one inside a function runs per
    call) is a plain attribute read, not another import through here."""
    exports = {name: room for room, names in rooms.items() for name in names}

    def __getattr__(name: str) -> object:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__, sorted(exports)
