"""The vllm backend kind: vLLM's offline engines in their own interpreter."""
