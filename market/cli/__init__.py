"""`walla market`: the market's command group, one CLI module per kind of command, each loaded when it runs.

    walla market init | serve | add-agent      walla.market.cli._operator (the ledger and its server)
    walla market agent                         walla.market.cli._agent (one live agent)
    walla market replay                        walla.market.cli._replay (a trained scenario, live)
    walla market audit | export                walla.market.cli._audit (verify a ledger; write it as Parquet)

The group is lazy (walla.cli.lazy): `walla market --help` and `walla market serve --help` import neither
FastAPI nor SQLAlchemy nor torch. Each command checks its options first, then imports its one
implementation module (market/commands/, market/agent.py, market/replay.py), so a mistake answers at once
too; what starting a server needs (port, operator token, keys, ledger) is market/launch.py's, which walla
serve shares. `walla-market ...` is `walla market ...`. Every error is one line on
stderr with the exit codes of cli/exits.py (1 data or state, 2 usage, 3 a server that does not answer).

Rooms (private: import their public names from this door):
- `_agent`: `walla market agent`: one live agent -- its LLM's forecast, its trained head's wager, learning from payouts.
- `_audit`: `walla market audit | export`: check a ledger end to end, or write it out as Parquet.
- `_operator`: The operator's commands: `walla market init | serve | add-agent` (the ledger and its HTTP server).
- `_replay`: `walla market replay`: a trained scenario's test split through a live market, checked against walla train.
"""

from __future__ import annotations

import typer
from walla.cli.lazy import Lazy, door, lazy_group, run

_OPERATOR = "walla.market.cli._operator:app"
COMMANDS = {  # command -> its module's app; the help line is the command's own (tests/cli checks)
    "init": Lazy(
        _OPERATOR, "Create the ledger's tables and the operator (its token is printed once).", "init"
    ),
    "add-agent": Lazy(
        _OPERATOR,
        "Register an agent (or, with --caller, a walla serve caller); prints its token once (only a hash is stored).",
        "add-agent",
    ),
    "serve": Lazy(_OPERATOR, "Serve the market's HTTP API and dashboard (GET /) on one ledger.", "serve"),
    "agent": Lazy(
        "walla.market.cli._agent:app",
        "Run one agent: report on every open round with the LLM's forecast and the head's wager; learn.",
    ),
    "replay": Lazy(
        "walla.market.cli._replay:app",
        "Stream a trained scenario's test split through a live market; check it against walla train's "
        "predictions.",
    ),
    "audit": Lazy(
        "walla.market.cli._audit:app",
        "Prove the ledger's state from its event chain, the chain from its MACs and the recorded heads, and "
        "recompute every payout from the reports (train/mechanism.py). Opens the database read-only.",
        "audit",
    ),
    "export": Lazy(
        "walla.market.cli._audit:app",
        "Write the ledger's tables (reports, resolutions, payouts, events, ...) as Parquet files.",
        "export",
    ),
}

market_app = typer.Typer(
    cls=lazy_group(COMMANDS),
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    context_settings={"max_content_width": 110},
)


@market_app.callback()
def _market() -> None:
    """A live wagering market: its ledger, HTTP server, live agents and replays."""


def run_market(argv: list[str], prog: str = "walla market") -> int:
    """`walla market <argv>`: the market's commands (the tests call this in-process)."""
    return run(market_app, argv, prog)


_ROOMS = {
    "_agent": ("agent_token",),
}
__getattr__, __all__ = door(__name__, _ROOMS)
