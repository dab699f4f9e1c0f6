"""The work of the market's commands, apart from their command lines.

Rooms (private: import their public names from this door):
- `_audit`: The work of `walla market audit | export`: both read the ledger through one read-only connection.
- `_operator`: The work of the operator's commands, `walla market init | add-agent | serve`: the ledger and its server.
"""

from __future__ import annotations

import importlib

_ROOMS = {
    "_operator": ("open_ledger", "setup_operator", "sign_ledger", "start_heads"),
}
_EXPORTS = {name: room for room, names in _ROOMS.items() for name in names}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:  # PEP 562: a room loads when a name of it is first asked for
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
