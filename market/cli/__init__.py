"""`walla market`: the market's command group, one CLI module per kind of command, each loaded when it runs.

Rooms (private: import their public names from this door):
- `_agent`: `walla market agent`: one live agent -- its LLM's forecast, its trained head's wager, learning from payouts.
- `_audit`: `walla market audit | export`: check a ledger end to end, or write it out as Parquet.
- `_operator`: The operator's commands: `walla market init | serve | add-agent` (the ledger and its HTTP server).
- `_replay`: `walla market replay`: a trained scenario's test split through a live market, checked against walla train.
- `_voice`: What every `walla market` command module shares: its name in messages and the one-line error.
"""

from __future__ import annotations

import importlib

_ROOMS = {
    "_agent": ("TOKEN_ENV", "agent_token"),
    "_operator": ("check_port", "operator_token"),
    "_voice": ("fail", "first_line"),
}
_EXPORTS = {name: room for room, names in _ROOMS.items() for name in names}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:  # PEP 562: a room loads when a name of it is first asked for
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
