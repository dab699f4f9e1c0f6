"""The hf backend kind: transformers models on CPU or GPU."""
