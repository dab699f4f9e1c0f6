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

from walla.cli.lazy import door

_ROOMS = {
    "_assemble": ("assemble_scenario", "softmax_rows"),
    "_data": ("ScenarioData",),
}
__getattr__, __all__ = door(__name__, _ROOMS)
