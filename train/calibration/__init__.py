"""Adaptive temperature scaling of each agent's option distribution.

Rooms (private: import their public names from this door):
- `_heads`: Temperature heads: small MLPs that map an agent's hidden state to a temperature, and the scaled distribution softmax(log p / T) they are trained and applied with (calibration/temperature.py, SPEC §9).
- `_temperature`: Adaptive temperature scaling of each agent's option distribution (SPEC §9, paper §4.5).
"""

from __future__ import annotations

import importlib

_ROOMS = {
    "_heads": ("TempHeads",),
    "_temperature": ("CalibrationConfig", "apply_calibration", "fit_calibration", "temperatures"),
}
_EXPORTS = {name: room for room, names in _ROOMS.items() for name in names}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:  # PEP 562: a room loads when a name of it is first asked for
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
