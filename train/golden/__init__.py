"""Training numbers pinned to TRAIN_SCHEMA (python -m walla.train.golden).

Rooms (private: import their public names from this door):
- `_check`: Training numbers pinned to TRAIN_SCHEMA: every method trained on one tiny fixed scenario, digested.
- `_setup`: What the golden check trains (train/golden/_check.py): a tiny fixed scenario, the hyperparameters, the paths.
"""

from walla.cli.lazy import door

_ROOMS = {
    "_setup": ("golden_scenario",),
}
__getattr__, __all__ = door(__name__, _ROOMS)
