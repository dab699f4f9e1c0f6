"""The root of the `walla` and `walla-market` commands: it mounts one CLI module per command group.

    walla market init | serve | add-agent      walla.market.cli_operator (the ledger and its server)
    walla market agent                         walla.market.cli_agent (one live agent)
    walla market replay                        walla.market.cli_replay (a trained scenario, live)
    walla market audit | export                walla.market.cli_audit (verify a ledger; write it as Parquet)
    walla check                                walla.extract.check (unchanged)

`walla-market ...` is `walla market ...`. Every error is one line on stderr and exit 1; bad usage
(unknown command or option, a value of the wrong type) is one line and exit 2.
"""

from __future__ import annotations

import sys

import typer
from typer.exceptions import TyperException
from walla.extract import check
from walla.market import cli_agent, cli_audit, cli_operator, cli_replay

market_app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="walla market: a live wagering market"
)
for _group in (cli_operator.app, cli_agent.app, cli_replay.app, cli_audit.app):
    market_app.add_typer(_group)  # no name: the group's commands join `walla market` directly

walla_app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="walla: cross-stage tools (check, market)"
)
walla_app.command("check", help=check.check.__doc__)(check.check)
walla_app.add_typer(market_app, name="market", help="a live wagering market: walla market --help")


def run(app: typer.Typer, argv: list[str], prog: str) -> int:
    """Run `app` with one-line usage errors (exit 2) instead of click's usage panel; returns the exit code."""
    command = typer.main.get_command(app)
    try:
        rv = command.main(args=argv, prog_name=prog, standalone_mode=False)
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


def run_market(argv: list[str], prog: str = "walla market") -> int:
    """`walla market <argv>`: the market's commands (the tests call this in-process)."""
    return run(market_app, argv, prog)


def main() -> None:
    """`walla-market ...`"""
    sys.exit(run_market(sys.argv[1:], "walla-market"))


def walla_main() -> None:
    """`walla ...`"""
    sys.exit(run(walla_app, sys.argv[1:], "walla"))
