"""The hf backend kind: transformers models on CPU or GPU.

Rooms (private: import their public names from this door):
- `_backend`: transformers backend (CPU or GPU; safetensors or GGUF): one forward pass per prompt batch; the class with its padded and packed forward passes as methods.
- `_compile`: torch.compile for the hf backend: regional compilation of the decoder layers, and when `--compile auto` turns it on.
- `_fixed`: Batch-invariant scoring by fixed shapes: every kernel sees the same shapes whatever the batch mix.
- `_fixed_probe`: The load-time check of fixed-shape scoring (hf/fixed.py), cached per machine like hf_checks' probes.
- `_kind`: The `hf` backend kind: how walla extract settles, fingerprints and loads a transformers model.
- `_lm_head`: The LM head applied where it is needed, never as a [batch, seq, vocab] tensor: prompt NLL over (token x vocabulary) chunks, and soft-capping (used by the hf backend).
- `_load`: Loading a model for the hf backend: weights and tokenizer onto the device (`load_model`), then the backend built around them with the checks it rests on, timed (`load_hf_backend`: self-check, invariance probes, compiling).
- `_modes`: What the hf backend will compute, known before any weights load: the dtype, whether scoring is batch-invariant and on which path, and the fingerprint inputs (`hf_identity`) that follow from them.
- `_packed`: Batch-invariant forward for the hf backend: prompts packed into one token stream, one attention call.
- `_probes`: The hf backend's one-time checks, cached so a model load reads weights instead of re-checking.
"""

from __future__ import annotations

from walla.cli.lazy import door

_ROOMS = {
    "_backend": ("HFBackend", "MIN_PREFIX"),
    "_compile": ("COMPILE_MIN_TOKENS", "COMPILE_MIN_TOKENS_CUDA", "explain_compile"),
    "_kind": ("FP32_PADDED_BOUND", "HF", "HFOptions"),
    "_load": ("load_hf_backend", "load_model"),
    "_modes": (
        "BATCH_ORDER",
        "DTYPES",
        "INVARIANT_SCORING",
        "explain_batch_invariant",
        "explain_dtype",
        "hf_identity",
        "invariant_path",
    ),
}
__getattr__, __all__ = door(__name__, _ROOMS)
