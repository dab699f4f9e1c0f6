"""What every `walla market` command module shares: its name in messages and the one-line error."""

from __future__ import annotations

import typer
from walla.cli import exits

PROG = "walla market"


def fail(message: object, code: int = exits.DATA) -> typer.Exit:
    """Print `walla market: error: <message>` as one line on stderr; the caller raises the returned Exit.

    `code`: walla's exit-code table (cli/exits.py): DATA by default, USAGE for a bad option, UNREACHABLE
    for a market URL or database server that does not answer."""
    return exits.fail("market", message, code)
