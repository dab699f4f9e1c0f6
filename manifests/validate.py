"""The one config-validation mechanism of walla: frozen pydantic dataclasses with unknown keys forbidden.

    from walla.manifests.validate import config, build, ConfigError

    @config
    class HeadConfig:
        lr: float = 5e-7          # Adam learning rate
        hidden: tuple[int, ...] = (512, 256)

        def __post_init__(self) -> None:          # range checks: one message per field
            check(self.lr > 0, "lr", "> 0", self.lr)

    cfg = build(HeadConfig, {"lr": 1e-4}, where="manifests/scenarios/x.yaml: train.hparams.walla")

A field that is also a command-line option is declared with `option(default, help)`: its name, type, default
and help are written once, and cli/options.py makes the typer option from it (as vLLM makes its flags from
EngineArgs); a problem found on the command line names the flag (`--seeds: ...`), not the field.

Every config class of every stage (model and dataset tables, scenario specs, extraction settings,
train plans, each method's hyper-parameters) is declared with `@config` and built with `build`/`collect`, so a file
with five problems reports all five at once, each as `<where>.<key>: <what is wrong>`. Values are
validated by type (pydantic, lax mode: "5e-7" written without a dot, which PyYAML reads as a string,
still becomes the float 5e-7; "fast" does not), then by the class's own `__post_init__` checks.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import ConfigDict, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass as _pydantic_dataclass

T = TypeVar("T")

_CONFIG = ConfigDict(extra="forbid", arbitrary_types_allowed=False)
_ADAPTERS: dict[type, TypeAdapter] = {}
COMMAND_LINE = "command line"  # the `where` of a config built from a command's options


class ConfigError(ValueError):
    """Every problem found in one load, one per line ('<file>: <key>: <what is wrong>').

    A usage error of walla's exit-code table (cli/exits.py): the command line or a config file it names is
    wrong, not the data."""

    exit_code = 2  # cli/exits.py USAGE

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        n = len(self.problems)
        head = f"{n} problem{'s' if n > 1 else ''} in the configuration:"
        super().__init__(
            self.problems[0] if n == 1 else head + "\n" + "\n".join(f"  - {p}" for p in problems)
        )


class UsageError(ConfigError):
    """One problem with what the command line asks for, found where it can first be checked (a device or
    package this machine lacks, an option another one excludes): exit 2 like every ConfigError."""

    def __init__(self, message: str):
        super().__init__([message])


def config(cls: type[T]) -> type[T]:
    """Class decorator: a frozen dataclass whose fields pydantic validates; unknown keys are errors."""
    return _pydantic_dataclass(frozen=True, config=_CONFIG)(cls)


def option(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    flag: str | None = None,
    metavar: str | None = None,
    repeat: bool = False,
    cli_type: type | None = None,
    default_factory: Any = dataclasses.MISSING,
) -> Any:
    """A config field that is also a command-line option (cli/options.py builds the option from it).

    Args:
        default, default_factory: the field's default (none: a required option).
        help: the option's help line, as shown by `walla <sub> --help`.
        flag: the option's names when not `--<field-name>`, e.g. "--set" or "--calibrated/--uncalibrated".
        metavar: the value's name in the help (default: the click type's, e.g. TEXT, INTEGER).
        repeat: a repeatable option (`--set a --set b`); else a tuple field takes one comma list.
        cli_type: the type the command line parses before the config validates it (e.g. str for "auto | N").
    """
    meta = {"help": help, "flag": flag, "metavar": metavar, "repeat": repeat, "cli_type": cli_type}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=meta)


def flag_of(cls: type, name: str) -> str:
    """The command-line flag of field `name` of `cls` (its first name: `--seed-list`, `--set`)."""
    for f in dataclasses.fields(cls):
        if f.name == name and f.metadata.get("flag"):
            return f.metadata["flag"].split("/")[0]
    return "--" + name.replace("_", "-")


def check(ok: bool, name: str, allowed: str, value: Any) -> None:
    """Raise the ValueError of one failed range check (used inside __post_init__)."""
    if not ok:
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


def _adapter(cls: type) -> TypeAdapter:
    if cls not in _ADAPTERS:
        _ADAPTERS[cls] = TypeAdapter(cls)
    return _ADAPTERS[cls]


def field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _describe(err: dict, cls: type, where: str) -> str:
    loc = ".".join(str(p) for p in err.get("loc", ()))
    kind = err.get("type", "")
    at = f"{where}.{loc}" if loc else where
    if where == COMMAND_LINE and loc and kind != "unexpected_keyword_argument":
        at = flag_of(cls, str(err["loc"][0])) + "".join(f"[{p}]" for p in err["loc"][1:])
    if kind == "unexpected_keyword_argument":
        names = field_names(cls)
        close = difflib.get_close_matches(str(err["loc"][-1]), names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"{at}: unknown key{hint}; allowed: {', '.join(names)}"
    if kind == "missing_keyword_argument" or kind == "missing":
        return f"{at}: missing required key"
    msg = str(err.get("msg", "invalid value"))
    msg = msg.removeprefix("Value error, ")
    if where == COMMAND_LINE and not loc:
        return msg  # a __post_init__ check: its message names the option
    if msg.startswith(at):  # a validator's message that names its flag already
        return msg
    if loc and "input" in err and kind != "value_error":
        return f"{at}: {msg}, got {err['input']!r}"
    return f"{at}: {msg}"


def collect(cls: type[T], raw: Mapping[str, Any] | None, where: str, problems: list[str]) -> T | None:
    """Build `cls` from `raw`; on failure append one line per problem to `problems` and return None."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        problems.append(f"{where}: expected a mapping of keys, got {raw!r}")
        return None
    try:
        return _adapter(cls).validate_python(dict(raw))
    except ValidationError as e:
        problems.extend(_describe(err, cls, where) for err in e.errors())
        return None


def build(cls: type[T], raw: Mapping[str, Any] | None, where: str) -> T:
    """Build `cls` from `raw` or raise ConfigError listing every problem."""
    problems: list[str] = []
    out = collect(cls, raw, where, problems)
    if problems:
        raise ConfigError(problems)
    assert out is not None
    return out


def replace(obj: T, where: str = "config", **changes: Any) -> T:
    """dataclasses.replace with the same validation and error format as `build`."""
    return build(type(obj), {**to_dict(obj, json=False), **changes}, where)


def to_dict(obj: Any, json: bool = True) -> dict[str, Any]:
    """A config as a plain dict (json=True: lists instead of tuples, ready for YAML/JSON)."""
    if json:
        return _adapter(type(obj)).dump_python(obj, mode="json")
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
