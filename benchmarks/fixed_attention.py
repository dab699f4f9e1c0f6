"""Fixed-shape attention (extract/backends/hf/_fixed.py) against the padded path's SDPA, one layer, side by side.

    .venv/bin/python benchmarks/fixed_attention.py --device cuda                  # Llama-3.1-8B's heads, 8,192 tokens
    .venv/bin/python benchmarks/fixed_attention.py --device cpu --tokens 1024     # this code path on a CPU

One pack of ARC-like prompts (lengths ~N(84, 25) tokens, as the ARC prompts of the extraction benchmark) laid
out as hf_fixed lays them (starts at multiples of 16, padded to `--tokens`), random bf16 q/k/v of the 8B shape's
heads (32 query heads, 8 kv heads, 128 dims). Timed, best of `--repeat`, same inputs:

- `attend` eager (the fixed path with --compile off) and compiled (`compiled_steps`, with --compile on);
- SDPA on the same prompts as a right-padded batch [prompts, heads, longest, 128], causal (what the padded
  path's attention costs; it needs no mask per block because each prompt is its own row).

It also checks what the fixed path promises, bit for bit: the first prompt's rows are the same at another
offset among other prompts, and in packs whose longest prompt needs 3 and many (9 at 8,192 tokens) key steps
where its own needs 1 (the compiled steps: the same graphs for any step count).
Last line: `RESULT device=.. eager_ms=.. compiled_ms=.. sdpa_ms=.. same_bits=..`.
"""

# ruff: noqa: E402 (the options are read before the imports that load torch)
from __future__ import annotations

import argparse
import time

from walla.cli.torch_build import device_argument

HEADS, KV_HEADS, DIM = 32, 8, 128  # Llama-3.1-8B
# the pack on a CPU unless --tokens says otherwise: bf16 attention of 8,192 tokens x 32 heads is a GPU size
CPU_TOKENS = 1024


def parser() -> argparse.ArgumentParser:
    """The options, built before torch loads: --help and a mistyped flag answer at once (one line, exit 2)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], usage=argparse.SUPPRESS)
    ap.add_argument(
        "--device",
        type=device_argument,
        help="cpu | cuda | cuda:N (default: cuda where torch sees one, else cpu)",
    )
    ap.add_argument(
        "--tokens",
        type=int,
        help=f"tokens of the pack (default: extraction's, hf_fixed.PACK_TOKENS, on CUDA; {CPU_TOKENS:,} on a CPU)",
    )
    ap.add_argument("--repeat", type=int, default=5)
    return ap


if __name__ == "__main__":
    parser().parse_args()

import numpy as np
import torch
import torch.nn.functional as F
from walla.extract.backends.hf import _fixed as hf_fixed


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def timed(fn, device: str, repeat: int) -> float:
    fn()
    sync(device)
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - t)
    return best


def stream(lengths: list[int], tokens: int, device: str) -> tuple[hf_fixed.Layout, hf_fixed._Stream]:
    lay = hf_fixed.layout([[1] * n for n in lengths], 0, tokens)
    return lay, hf_fixed._Stream(lay.block_start.to(device), lay.span)


def run(q, k, v, st: hf_fixed._Stream, compiled: bool) -> torch.Tensor:
    """One layer's attention over a fresh stream (its step masks built in the call)."""
    return hf_fixed.fixed_attention_core(
        q, k, v, hf_fixed._Stream(st.block_start, st.span, compiled=compiled)
    )


def main() -> None:
    args = parser().parse_args()
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.tokens is None:
        args.tokens = CPU_TOKENS if torch.device(args.device).type == "cpu" else hf_fixed.PACK_TOKENS
    dev, n_tok = args.device, hf_fixed.check_pack_tokens(args.tokens)
    rng = np.random.default_rng(0)
    pool = [int(x) for x in np.clip(rng.normal(84, 25, 4 * n_tok // 84), 30, 250)]
    packs = hf_fixed.plan(np.array(pool), n_tok)
    lengths = [pool[i] for i in packs[len(packs) // 2]]  # a pack from the middle: typical lengths
    lay, st = stream(lengths, n_tok, dev)
    g = torch.Generator(device=dev).manual_seed(0)

    def qkv(n: int = n_tok) -> list[torch.Tensor]:
        return [
            torch.randn(1, h, n, DIM, device=dev, dtype=torch.bfloat16, generator=g)
            for h in (HEADS, KV_HEADS, KV_HEADS)
        ]

    q, k, v = qkv()
    used = sum(hf_fixed.aligned(n) for n in lengths)
    print(
        f"pack: {len(lengths)} prompts, {sum(lengths):,} tokens ({used:,} aligned to {hf_fixed.QUANTUM}) of "
        f"{n_tok:,}; {HEADS} heads / {KV_HEADS} kv heads x {DIM}; bf16 on {dev}; attention matmuls in "
        f"{str(hf_fixed.attention_matmul(torch.device(dev).type, torch.bfloat16)).removeprefix('torch.')}"
    )
    # one stream per mode, as a forward keeps one for all its layers: the step masks are built once, not timed
    st_eager, st_compiled = (hf_fixed._Stream(st.block_start, st.span, compiled=c) for c in (False, True))
    t0 = time.perf_counter()
    hf_fixed.fixed_attention_core(q, k, v, st_compiled)
    sync(dev)
    compile_s = time.perf_counter() - t0
    eager = timed(lambda: hf_fixed.fixed_attention_core(q, k, v, st_eager), dev, args.repeat)
    compiled = timed(lambda: hf_fixed.fixed_attention_core(q, k, v, st_compiled), dev, args.repeat)
    longest = max(lengths)
    pq, pk, pv = (
        torch.randn(len(lengths), h, longest, DIM, device=dev, dtype=torch.bfloat16, generator=g)
        for h in (HEADS, KV_HEADS, KV_HEADS)
    )
    sdpa = timed(
        lambda: F.scaled_dot_product_attention(pq, pk, pv, is_causal=True, enable_gqa=True), dev, args.repeat
    )
    print(f"{'what':<58} {'ms':>8} {'vs SDPA':>8}")
    for what, s in (
        ("fixed-shape attend, eager (--compile off)", eager),
        (f"fixed-shape attend, compiled (first call {compile_s:.1f} s)", compiled),
        (f"SDPA, right-padded batch [{len(lengths)}, {longest}], causal", sdpa),
    ):
        print(f"{what:<58} {s * 1e3:8.2f} {s / sdpa:8.1f}")
    # the promise: a prompt's rows the same bits at another offset among others, and with 3 key steps vs 1
    n0, s0 = lengths[0], lay.starts[0]
    checks = {}
    long_ = min(1100, n_tok - hf_fixed.aligned(n0) - hf_fixed.QUANTUM)  # 9 key steps at 8,192 tokens
    many = hf_fixed.steps(hf_fixed.aligned(long_) // hf_fixed.QUANTUM, None)
    for name, lens, at in (
        ("another mix", [*lengths[1:5], n0, *lengths[5:]], 4),
        ("3 key steps", [n0, 300], 0),
        (f"{many} key steps", [n0, long_], 0),
    ):
        lay2, st2 = stream(lens, n_tok, dev)
        s2 = lay2.starts[at]
        x = qkv()
        for src, dst in zip((q, k, v), x, strict=True):
            dst[0, :, s2 : s2 + n0] = src[0, :, s0 : s0 + n0]
        for compiled_ in (False, True):
            a = run(q, k, v, st, compiled_)[0, s0 : s0 + n0]
            b = run(*x, st2, compiled_)[0, s2 : s2 + n0]
            checks[f"{name}, {'compiled' if compiled_ else 'eager'}"] = torch.equal(a, b)
    print("same bits for the first prompt: " + ", ".join(f"{k}: {v}" for k, v in checks.items()))
    print(
        f"RESULT device={dev} tokens={n_tok} eager_ms={eager * 1e3:.2f} compiled_ms={compiled * 1e3:.2f} "
        f"sdpa_ms={sdpa * 1e3:.2f} eager_over_sdpa={eager / sdpa:.1f} compiled_over_sdpa={compiled / sdpa:.1f} "
        f"same_bits={all(checks.values())}"
    )


if __name__ == "__main__":
    main()
