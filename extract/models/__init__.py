"""Where a model's files come from: the catalog entry resolved, the hub, GGUF copies, the user cache."""
