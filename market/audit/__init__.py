"""The ledger audit: stored values, the state rebuilt from events, the heads outside the database.

Rooms (private: import their public names from this door):
- `_heads`: The audit's anchor outside the database: the head file (`EVENT_ID HASH [HMAC]` per line) and its key.
- `_prove`: Audit a ledger end to end: it proves the tables' state from the hash-chained event log, and the log against the heads the operator recorded, so neither an edited row nor a rewritten chain passes.
- `_rebuild`: The audit's proof of the state: rebuild every ledger row from the event log alone, then compare the tables with it field by field.
- `_values`: The audit's first pass: read every ledger row as the database holds it and check each stored value's type.
"""

from __future__ import annotations

from walla.cli.lazy import door

_ROOMS = {
    "_heads": ("head_line", "holds_noted", "identity", "noted_in", "parse_heads", "read_heads"),
    "_prove": ("audit", "not_a_ledger", "open_readonly"),
}
__getattr__, __all__ = door(__name__, _ROOMS)
