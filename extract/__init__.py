"""Stage 1: datasets -> prompts -> one LLM forward pass per prompt -> feature sets in the store."""
