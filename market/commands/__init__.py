"""The work of the market's commands, apart from their command lines.

Rooms (private: import their public names from this door):
- `_audit`: The work of `walla market audit | export`: both read the ledger through one read-only connection.
- `_operator`: The work of the operator's commands, `walla market init | add-agent | serve`: the ledger and its server.
"""

from __future__ import annotations

from walla.cli.lazy import door

_ROOMS = {
    "_operator": ("open_ledger", "setup_operator", "sign_ledger", "start_heads"),
}
__getattr__, __all__ = door(__name__, _ROOMS)
