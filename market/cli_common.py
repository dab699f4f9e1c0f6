"""What every `walla market` command module shares: its name in messages and the one-line error."""

from __future__ import annotations

import typer

PROG = "walla market"


def fail(message: object, code: int = 1) -> typer.Exit:
    """Print `walla market: error: <message>` as one line on stderr; the caller raises the returned Exit."""
    typer.echo(f"{PROG}: error: {' '.join(str(message).split())}", err=True)
    return typer.Exit(code)
