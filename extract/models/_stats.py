"""What a model costs per token: its non-embedding parameter count (forward FLOPs ~ 2 x that x tokens)."""

from __future__ import annotations


def non_embedding_params(model) -> int | None:
    """Parameters of a transformers model minus its input and (untied) output embeddings (None: unknown)."""
    if model is None or not hasattr(model, "parameters"):
        return None
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    for get in ("get_input_embeddings", "get_output_embeddings"):
        emb = getattr(model, get, lambda: None)()
        if emb is not None and id(emb.weight) in seen:
            total -= emb.weight.numel()
            seen.discard(id(emb.weight))
    return int(total)
