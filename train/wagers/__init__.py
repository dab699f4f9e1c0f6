"""WALLA's wager heads and their batched, decentralized training.

Rooms (private: import their public names from this door):
- `_dropout`: WALLA's dropout keep-masks: drawn on the host from per-seed numpy generators, the same bits as ever, faster.
- `_heads`: Wager heads: one small MLP per agent on that agent's own last-layer hidden state (SPEC §5.1).
- `_step`: The maths of one WALLA training batch, shared by walla train (wagers/training.py) and a live agent (market/head.py): raw scores -> wagers, realized advantages, hindsight best responses and each agent's own loss; the backward, per-head clipping and optimizer step; the early-stopping metric.
- `_stopping`: Online early stopping of WALLA's batched heads, one stopping state per seed (SPEC §4.2).
- `_training`: WALLA's batched, decentralized training loop: every agent of every seed in one StackedHeads.
"""

from __future__ import annotations

from walla.cli.lazy import door

_ROOMS = {
    "_dropout": ("DropoutMasks", "keep_mask", "raw_limit"),
    "_heads": ("StackedHeads", "WagerHead", "stack_hidden"),
    "_step": ("optimizer_step", "wager_loss"),
    "_stopping": ("OnlineStop",),
    "_training": ("_Layout", "_dropout", "hidden_stats", "init_heads", "train_heads"),
}
__getattr__, __all__ = door(__name__, _ROOMS)
