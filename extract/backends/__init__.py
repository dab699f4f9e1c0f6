"""Extraction backends: `hf` (transformers), `vllm` (GPU), `dummy` (seeded, for tests)."""
