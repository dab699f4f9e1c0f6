"""Scenario assembly: a scenario manifest + the store -> the arrays every method consumes.

Rooms (private: import their public names from this door):
- `_assemble`: Scenario assembly: a scenario manifest + the store -> the arrays every method consumes.
- `_data`: ScenarioData: the assembled arrays of one scenario -- the only input of training and evaluation.
- `_hidden_fill`: Copying hidden states from feature sets into a scenario's per-slot [N, H] arrays (store/scenario/_assemble.py).
- `_routing`: Private-context routing: which agent slot sees which prompt variant for each question (SPEC §3.3).
- `_select`: Choosing the feature sets a scenario reads: one complete set per (model, dataset, variant).
- `_sources`: The feature sets a scenario reads, opened and checked: one Part per dataset (two for OOD scenarios).
"""

from __future__ import annotations

import importlib

_ROOMS = {
    "_assemble": ("assemble_scenario", "softmax_rows"),
    "_data": ("ScenarioData",),
}
_EXPORTS = {name: room for room, names in _ROOMS.items() for name in names}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:  # PEP 562: a room loads when a name of it is first asked for
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
