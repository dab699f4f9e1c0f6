"""Training numbers pinned to TRAIN_SCHEMA (python -m walla.train.golden).

Rooms (private: import their public names from this door):
- `_check`: Training numbers pinned to TRAIN_SCHEMA: every method trained on one tiny fixed scenario, digested.
- `_setup`: What the golden check trains (train/golden/_check.py): a tiny fixed scenario, the hyperparameters, the paths.
"""

import importlib

_ROOMS = {
    "_setup": ("golden_scenario",),
}
_EXPORTS = {name: room for room, names in _ROOMS.items() for name in names}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:  # PEP 562: a room loads when a name of it is first asked for
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
