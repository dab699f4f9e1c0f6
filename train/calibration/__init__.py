"""Adaptive temperature scaling of each agent's option distribution.

Rooms (private: import their public names from this door):
- `_heads`: Temperature heads: small MLPs that map an agent's hidden state to a temperature, and the scaled distribution softmax(log p / T) they are trained and applied with (calibration/temperature.py, SPEC §9).
- `_temperature`: Adaptive temperature scaling of each agent's option distribution (SPEC §9, paper §4.5).
"""

from __future__ import annotations

from walla.cli.lazy import door

_ROOMS = {
    "_heads": ("TempHeads",),
    "_temperature": (
        "CalibrationConfig",
        "agent_calibrator",
        "apply_calibration",
        "fit_calibration",
        "temperatures",
    ),
}
__getattr__, __all__ = door(__name__, _ROOMS)
