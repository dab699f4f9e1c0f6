"""Where a model's files come from: the catalog entry resolved, the hub, GGUF copies, the user cache.

Rooms (private: import their public names from this door):
- `_parts`: a model published as numbered chunk packages (PyPI), joined in part order and sha256-checked.
- `_cache`: The per-user cache folder, `$WALLA_CACHE` (default ~/.cache/walla): the GGUF copies, the load-time checks' verdicts and the model files' sha256 (`file_sha256`, memoized per version of the file) live under it; it imports neither torch nor transformers (`_gguf` does).
- `_gguf`: The per-user cache under `$WALLA_CACHE` (default ~/.cache/walla) and the GGUF -> safetensors copies in it.
- `_hub`: Hugging Face Hub access that fails fast and in one line.
- `_resolve`: Resolve a ModelEntry (manifests/models.yaml) to something a backend can load, plus its identity.
- `_stats`: What a model costs per token: its non-embedding parameter count (forward FLOPs ~ 2 x that x tokens).
"""

from __future__ import annotations

from walla.cli.lazy import door

_ROOMS = {
    "_parts": ("EXTRA", "load_parts"),
    "_cache": ("cache_root",),
    "_gguf": ("converted_gguf_dir", "local_weights_dir", "quiet_transformers"),
    "_resolve": ("ResolvedModel", "pin_revision", "resolve_model"),
    "_stats": ("non_embedding_params",),
}
__getattr__, __all__ = door(__name__, _ROOMS)
