"""A command's options generated from its config class: each setting is written once, as a field.

    @config
    class EvalConfig:
        report: Path = option(help="Markdown report to write")       # -> --report PATH (required)
        plots: bool = option(True, "--no-plots: tables only")        # -> --plots/--no-plots

    config_command(app, EvalConfig, body, name="eval", help="...")   # body(options, extras) runs it

The field holds the option's name (`--` + the field's name, or its `flag`), its type, default and help
(manifests/validate.py `option`), as vLLM generates its flags from EngineArgs' fields. typer builds the
click command from the function this module writes; the command's body builds the config through the
one validator before it imports any stage, so a bad option answers at once. A field declared without
`option(...)` is not on the command line.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from walla.cli import new_app
from walla.cli.exits import USAGE, fail, message_of
from walla.cli.torch_build import refuse_cuda_early
from walla.manifests.validate import COMMAND_LINE, build

SCALARS = (bool, int, float, str, Path)


def _cli_type(annotation: Any, meta: typing.Mapping[str, Any]) -> Any:
    """The type click parses for a field's annotation (a tuple field: one comma list, or repeated)."""
    if meta.get("cli_type") is not None:
        return meta["cli_type"]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _cli_type(inner[0], meta) if len(inner) == 1 else str  # Path | str: the text as given
    if origin in (tuple, list, dict):
        return list[str] if meta.get("repeat") or origin is dict else str
    return annotation if annotation in SCALARS else str  # Literal[...] and the like: the text


def _metavar(name: str, cli_type: Any) -> str:
    """What the help shows for an option's value: N for a number, else the field's name (--store STORE)."""
    if cli_type in (int, float):
        return "N"
    return name.upper().removesuffix("S") if cli_type == list[str] else name.upper()


def app(**settings: Any) -> typer.Typer:
    """A typer app of walla (walla.cli.new_app)."""
    return new_app(**settings)


def _flags(f: dataclasses.Field, cli_type: Any) -> list[str]:
    flag = f.metadata.get("flag")
    if flag:
        return [flag]
    name = "--" + f.name.replace("_", "-")
    if cli_type is bool and f.default is True:
        return [f"{name}/--no-{name[2:]}"]
    return [name]


def option_params(cls: type) -> list[inspect.Parameter]:
    """One keyword parameter per `option(...)` field of `cls`, its default a typer.Option."""
    hints = typing.get_type_hints(cls)
    params = []
    for f in dataclasses.fields(cls):
        if "help" not in f.metadata:
            continue
        cli_type = _cli_type(hints[f.name], f.metadata)
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = None  # a container: none given
        else:
            default = ...  # required
        if isinstance(default, tuple):
            default = list(default) or None
        elif isinstance(default, Path) and cli_type is str:
            default = str(default)
        metavar = f.metadata.get("metavar") or (None if cli_type is bool else _metavar(f.name, cli_type))
        opt = typer.Option(
            default,
            *_flags(f, cli_type),
            help=f.metadata["help"],
            metavar=metavar,
            show_default=not (default is None or default is False or default is ...),
        )
        params.append(
            inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=cli_type)
        )
    return params


def config_command(
    target: typer.Typer,
    cls: type,
    body: Callable[[dict[str, Any], dict[str, Any]], None],
    *,
    name: str,
    help: str,
    extra: typing.Sequence[inspect.Parameter] = (),
) -> None:
    """Register command `name` on `target`: its options are `cls`'s option fields plus `extra` (e.g. --debug).

    `body(options, extras)` gets the config's options (those not given left out, so the config's own
    defaults apply) and the extra parameters' values, by name.
    """
    params = [*option_params(cls), *extra]
    extra_names = {p.name for p in extra}

    def command(**given: Any) -> None:
        options = {k: v for k, v in given.items() if k not in extra_names and v is not None and v != []}
        options = {k: v for k, v in options.items() if v != ()}
        body(options, {k: given[k] for k in extra_names})

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__name__ = name.replace("-", "_")
    command.__doc__ = help
    target.command(name=name, help=help)(command)


def grouped_options(cls: type, name: str, sub: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator of a hand-written typer command: `cls`'s option fields become options of the command too,
    and the command gets them as one `cls` value in its parameter `name`, built through the one validator
    (`build_config`: a bad one is `walla <sub>: error: --flag: ...`, exit 2) before its body runs.

        @app.command()
        @options.grouped_options(ConnectionLimits, "limits", sub="market")
        def serve(db: str = DB, limits: ConnectionLimits = None) -> None: ...   # --read-timeout ... too
    """

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        own = [p for p in inspect.signature(fn).parameters.values() if p.name != name]
        fields = option_params(cls)
        names = {p.name for p in fields}

        @functools.wraps(fn)
        def command(**given: Any) -> Any:
            grouped = build_config(cls, {k: given.pop(k) for k in names}, sub)
            return fn(**given, **{name: grouped})

        command.__signature__ = inspect.Signature([*own, *fields])  # type: ignore[attr-defined]
        # typer resolves the command's own annotations in fn's module (functools.wraps: __wrapped__); the
        # grouped parameter's is dropped unread, so `cls` may be imported anywhere
        command.__annotations__ = {p.name: fn.__annotations__.get(p.name, p.annotation) for p in own}
        command.__annotations__.update({p.name: p.annotation for p in fields})
        return command

    return wrap


def build_config(cls: type, options: dict[str, Any], sub: str) -> Any:
    """`cls` from a command's options through the one validator, or `walla <sub>: error: --flag: ...`, exit 2."""
    try:
        return build(cls, options, where=COMMAND_LINE)
    except ValueError as e:  # ConfigError: every problem, each naming its flag
        raise fail(sub, e, USAGE) from None


def checked_config(cls: type, options: dict[str, Any], sub: str, check_names: Callable[[Any], None]) -> Any:
    """`build_config`, then what a stage that imports torch answers first, each in one line: a CUDA device
    this machine can never give (cli/torch_build.py, exit 2) and a name the options give that is not known
    (`check_names(cfg)` raises KeyError: exit 2; or answers with its own line and code)."""
    cfg = build_config(cls, options, sub)
    refuse_cuda_early(sub, cfg.device)  # answered without importing torch
    try:
        check_names(cfg)
    except KeyError as e:
        raise fail(sub, message_of(e), USAGE) from None
    return cfg
