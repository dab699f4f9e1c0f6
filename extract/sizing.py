"""`--batch-tokens auto` / `--shard-rows auto`: how much one forward pass and one durable shard hold.

    sizes = settle_sizes("cuda", None, None, ModelShape.from_config(config, "bfloat16"), free_bytes=78 << 30)
    sizes.batch_tokens, sizes.shard_rows, sizes.why   # 65536, 8192, "batch tokens auto -> 65,536: ..."

On a CPU the sizes stay the ones measured there (8,192 padded tokens per pass, 256 rows per shard): a
CPU's GEMMs reach their speed at a few thousand rows, and a 256-row shard is ~1-2 minutes of work. On a
CUDA device those sizes left an H100 idle (issue 22: 0.54-0.58x a bare loop), so they come from the device
memory free before the model loads and from the model's shape:

- the weights (parameters x dtype bytes) and a fixed reserve (CUDA context, cuBLAS workspaces, the LM
  head's fixed-size chunks) come off the free memory; half of the rest is for one forward pass (the other
  half is headroom for the caching allocator's fragmentation with ever-changing padded shapes);
- one token of a padded forward pass holds its residual stream and, in the widest layer step, the MLP's
  three intermediate-size tensors or attention's q/k/v and RoPE copies (GQA keys counted at full width, as
  transformers may repeat them), RMSNorm's float32 copies, the final hidden state and its prompt-NLL copy,
  and the shared-prefix KV cache of every layer (extract/backends/hf/_backend.py reuses it per batch);
- the token count is rounded down to a power of two and capped at 65,536 (the issue's H100 runs: 65,536
  reached 0.96x the bare loop on the 8B shape; larger batches add no GEMM efficiency, only memory risk);
- a shard is 8,192 rows (fewer when its hidden states would take more than 1 GiB of host memory): many
  forward passes per scoring call, so the device is not idle between calls, while a crash loses at most
  one shard of work.

Pure arithmetic (no torch): the hf backend kind reads the model's config and `torch.cuda.mem_get_info`.
Explicit flags always win.
"""

from __future__ import annotations

from dataclasses import dataclass

CPU_BATCH_TOKENS = 8192  # padded tokens per forward pass on a CPU (and wherever no CUDA sizing applies)
CPU_SHARD_ROWS = 256  # rows per durable shard on a CPU
GPU_MAX_BATCH_TOKENS = 1 << 16  # cap of the CUDA sizing (see module docstring)
GPU_MIN_BATCH_TOKENS = 1 << 10  # floor: below this a GPU runs latency-bound anyway
GPU_FALLBACK_BATCH_TOKENS = 1 << 14  # CUDA without a free-memory figure or a model shape
GPU_SHARD_ROWS = 8192
SHARD_HOST_BYTES = 1 << 30  # host memory for one shard's hidden states (float32 result + float16 copy)
MEMORY_SHARE = 0.5  # of the memory left after weights and reserve, given to one forward pass
RESERVE_BYTES = 1 << 30  # CUDA context, cuBLAS/cuDNN workspaces, allocator slack
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelShape:
    """What the memory of a decoder-only transformer's forward pass depends on."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    dtype_bytes: int
    tied: bool = False  # input embedding and LM head share one matrix

    @classmethod
    def from_config(cls, config, dtype: str) -> ModelShape:
        """From a transformers config (its text part for multimodal ones) and a dtype name.

        Raises:
            ValueError: a field the arithmetic needs is missing (e.g. a mixture-of-experts layout).
        """
        cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
        need = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
        missing = [k for k in need if not isinstance(getattr(cfg, k, None), int)]
        if missing:
            raise ValueError(f"{type(cfg).__name__} has no integer {', '.join(missing)}")
        heads = cfg.num_attention_heads
        return cls(
            layers=cfg.num_hidden_layers,
            hidden=cfg.hidden_size,
            heads=heads,
            kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
            intermediate=cfg.intermediate_size,
            vocab=cfg.vocab_size,
            dtype_bytes=DTYPE_BYTES[dtype],
            tied=bool(getattr(cfg, "tie_word_embeddings", False)),
        )

    def weight_bytes(self) -> int:
        """Parameters x dtype bytes of a Llama-style model (embedding, untied head, attention, gated MLP, norms)."""
        d, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        per_layer = d * q + 2 * d * kv + q * d + 3 * d * self.intermediate + 2 * d
        embeddings = self.vocab * d * (1 if self.tied else 2)
        return (embeddings + self.layers * per_layer + d) * self.dtype_bytes

    def token_bytes(self) -> int:
        """Device bytes one token of a padded forward pass holds at its peak (module docstring)."""
        d, q = self.hidden, self.heads * self.head_dim
        attention = 8 * q + d  # q, k, v (GQA at full width), RoPE copies, SDPA output and its copy, o_proj
        mlp = 3 * self.intermediate + d  # act(gate), up, their product; down_proj's output
        layer = 2 * d + max(attention, mlp)  # + the residual stream and the normed input
        kept = 2 * d  # the final hidden state and the prompt-NLL gather of it
        norms_fp32 = 2 * 4 * d  # RMSNorm computes in float32
        kv_cache = self.layers * 2 * self.kv_heads * self.head_dim * self.dtype_bytes  # shared-prefix cache
        return self.dtype_bytes * (layer + kept) + norms_fp32 + kv_cache + 24  # + ids, masks, positions


@dataclass(frozen=True)
class Sizes:
    batch_tokens: int
    shard_rows: int
    why: str  # one line: the sizes and where they came from


def _pow2_floor(n: int) -> int:
    return 1 << (max(int(n), 1).bit_length() - 1)


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def gpu_batch_tokens(shape: ModelShape, free_bytes: int, fixed_bytes: int = 0) -> tuple[int, str]:
    """(batch tokens, why) for a CUDA device with `free_bytes` free before the model loads.

    `fixed_bytes`: device memory of the scoring path that does not grow with the batch (the LM head's
    fixed-size chunks), reserved next to RESERVE_BYTES.
    """
    weights = shape.weight_bytes()
    left = free_bytes - weights - RESERVE_BYTES - fixed_bytes
    per_token = shape.token_bytes()
    fit = int(max(left, 0) * MEMORY_SHARE) // per_token
    tokens = min(max(_pow2_floor(fit), GPU_MIN_BATCH_TOKENS), GPU_MAX_BATCH_TOKENS)
    if fit >= GPU_MAX_BATCH_TOKENS:
        bound = f"capped at {GPU_MAX_BATCH_TOKENS:,}"
    elif fit < GPU_MIN_BATCH_TOKENS:
        bound = f"raised to the floor {GPU_MIN_BATCH_TOKENS:,}: memory is tight"
    else:
        bound = "rounded down to a power of two"
    why = (
        f"{_gib(free_bytes)} free - ~{_gib(weights)} weights - {_gib(RESERVE_BYTES + fixed_bytes)} reserved, "
        f"{MEMORY_SHARE:.0%} of the rest at ~{per_token / 1024:.0f} KiB/token ({shape.layers} layers, "
        f"hidden {shape.hidden}, MLP {shape.intermediate}, {shape.dtype_bytes}-byte dtype) = {fit:,} tokens, {bound}"
    )
    return tokens, why


def gpu_shard_rows(hidden: int | None) -> tuple[int, str]:
    """(shard rows, why) on a CUDA device: GPU_SHARD_ROWS, fewer where the hidden states outgrow the host budget."""
    if not hidden:
        return GPU_SHARD_ROWS, f"{GPU_SHARD_ROWS:,} rows per scoring call"
    fit = _pow2_floor(SHARD_HOST_BYTES // (6 * hidden))  # float32 result + float16 store copy
    rows = min(GPU_SHARD_ROWS, fit)
    return (
        rows,
        f"{rows:,} rows per scoring call (x hidden {hidden}: <= {_gib(SHARD_HOST_BYTES)} on the host)",
    )


def settle_sizes(
    device: str,
    batch_tokens: int | None,
    shard_rows: int | None,
    shape: ModelShape | None = None,
    free_bytes: int | None = None,
    fixed_bytes: int = 0,
    unknown: str = "",
) -> Sizes:
    """The sizes a run uses: explicit values as given, `None` (auto) sized to `device` (module docstring).

    `shape` / `free_bytes` are needed on CUDA only; without them (`unknown` says why) CUDA gets
    GPU_FALLBACK_BATCH_TOKENS.
    """
    cuda = device.startswith("cuda")
    if batch_tokens is not None:
        bt, bt_why = batch_tokens, f"batch tokens {batch_tokens:,} [--batch-tokens]"
    elif not cuda:
        bt, bt_why = CPU_BATCH_TOKENS, f"batch tokens auto -> {CPU_BATCH_TOKENS:,} (the CPU size)"
    elif shape is None or free_bytes is None:
        bt = GPU_FALLBACK_BATCH_TOKENS
        bt_why = f"batch tokens auto -> {bt:,} on {device} ({unknown or 'no free-memory figure'})"
    else:
        bt, how = gpu_batch_tokens(shape, free_bytes, fixed_bytes)
        bt_why = f"batch tokens auto -> {bt:,} on {device}: {how}"
    sr, sr_why = settle_shard_rows(device, shard_rows, shape.hidden if shape else None)
    return Sizes(bt, sr, f"{bt_why}; {sr_why}")


def settle_shard_rows(device: str, shard_rows: int | None, hidden: int | None = None) -> tuple[int, str]:
    """(shard rows, why): as given, else the CPU size, else the CUDA size (gpu_shard_rows)."""
    if shard_rows is not None:
        return shard_rows, f"shard rows {shard_rows:,} [--shard-rows]"
    if not device.startswith("cuda"):
        return CPU_SHARD_ROWS, f"shard rows auto -> {CPU_SHARD_ROWS:,} (the CPU size)"
    rows, how = gpu_shard_rows(hidden)
    return rows, f"shard rows auto -> {how}"
