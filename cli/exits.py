"""walla's one exit-code table and its one error line, shared by every subcommand (docs/cli.md).

    raise fail("train", "--seeds must be >= 1, got 0", USAGE)   # walla train: error: --seeds must be ...

| code | meaning                                                                   | e.g.                                  |
|------|---------------------------------------------------------------------------|---------------------------------------|
| 0    | done                                                                      |                                       |
| 1    | DATA: the command line is fine; the files or state it names are not       | no such store or runs directory, a    |
|      | (missing, corrupt, stale, too small), or a check it ran failed            | corrupt file, `walla check` FAIL      |
| 2    | USAGE: the command line itself is wrong: an unknown command, option or    | `--seeds 0`, `--scenario hetro`,      |
|      | name, a bad value, options that do not go together, a device not here     | `--device cuda` without a GPU         |
| 3    | UNREACHABLE: a service did not answer (the model hub, a market's URL, a   | offline hub, `--db postgresql://...`  |
|      | database server)                                                          | down                                  |
| 130  | interrupted (Ctrl-C); rerun the same command to continue                  |                                       |

Every error is ONE line on stderr, `walla <sub>: error: <what is wrong, naming the option or file>`, and names
walla's own commands (`walla extract ...`), never older script names or make targets.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer

OK, DATA, USAGE, UNREACHABLE, INTERRUPTED = 0, 1, 2, 3, 130
TABLE = {  # the table above, by code: docs/cli.md and tests/cli/test_exits.py read it
    DATA: "the files or state the command names are missing, corrupt or stale, or its check failed",
    USAGE: "the command line is wrong: an unknown command, option or name, a bad value, a device not here",
    UNREACHABLE: "a service did not answer: the model hub, a market's URL, a database server",
    INTERRUPTED: "interrupted; rerun the same command to continue",
}


def error_line(sub: str, message: object) -> str:
    """`walla <sub>: error: <message>` on one line (a library's newlines folded)."""
    text = " ".join(str(message).split())
    return f"walla {sub}: error: {text}" if sub else f"walla: error: {text}"


def fail(sub: str, message: object, code: int) -> typer.Exit:
    """Print the one error line of `walla <sub>` on stderr; the caller raises the returned Exit(code)."""
    typer.echo(error_line(sub, message), err=True)
    return typer.Exit(code)


def message_of(e: BaseException) -> str:
    """An exception's words: a KeyError's own message (not its repr in quotes), an OSError's path and what
    went wrong in words (not '[Errno 21]')."""
    if isinstance(e, KeyError) and e.args:
        return str(e.args[0])
    if isinstance(e, OSError) and e.errno is not None:
        from walla.store.files import describe_os_error  # polars: only on this error path

        return describe_os_error(e)
    return str(e)


def code_of(e: BaseException) -> int | None:
    """The exit code of an error a user can cause; None for anything else (a bug: its traceback shows).

    An exception class may say what it means (`exit_code = USAGE` on ConfigError, UNREACHABLE on the
    hub's); otherwise an unknown name (KeyError) is USAGE, and bad data or state (ValueError, RuntimeError,
    OSError, a missing package) is DATA.
    """
    code = getattr(e, "exit_code", None)
    if isinstance(code, int):
        return code
    if isinstance(e, KeyError):
        return USAGE
    if isinstance(e, (ValueError, RuntimeError, OSError, ImportError)):
        return DATA
    return None


@contextmanager
def answered(sub: str, debug: bool = False, interrupted: str = TABLE[INTERRUPTED]) -> Iterator[None]:
    """Run a command's work: every error a user can cause becomes its one line and its code of the table
    (`debug`: the traceback instead); Ctrl-C is `interrupted` and 130."""
    try:
        yield
    except typer.Exit:
        raise
    except KeyboardInterrupt:
        raise fail(sub, interrupted, INTERRUPTED) from None
    except Exception as e:
        code = code_of(e)
        if code is None or debug:
            raise
        raise fail(sub, message_of(e), code) from None
