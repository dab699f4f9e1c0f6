"""Extraction throughput on the embedded SmolLM2-135M (CPU): ours vs a reference-style loop.

    .venv/bin/python benchmarks/extract_throughput.py [--n 48] [--ref-n 15] [--rss-rows 0]

Prints, from ONE run (the machine's peaks are measured in the same run, before and after):
- the fp32 and bf16 matmul peaks of this machine (2048^3 GEMMs, best of several);
- our hf backend (fp32 or bf16, SDPA, length buckets, LM head on the last position only, chunked
  prompt NLL): tokens/s and model-FLOP utilization MFU = 2 x non-embedding params x tokens / time,
  divided by the peak of the dtype we run (also printed against the bf16 peak, as asked: on CPUs
  without native bf16 that ratio is meaningless, > 1);
- a reference-style loop on the same prompts (SPEC §1.5, §2.3, §10.14: fp32, eager attention, batches
  of 5 in input order, left padding, full-vocabulary log_softmax over ALL positions via
  model(...).logits with output_hidden_states, and the separate perplexity pass the reference needs
  for PackLLM): tokens/s = prompt tokens / time of both passes;
- the LLM passes over a dataset for the 12-agent homogeneous PubMedQA scenario: the reference runs
  one per agent slot (12), we run one per distinct (model, prompt variant) (2).
Last line: `RESULT mfu=<x> speedup_vs_reference=<x> passes_ratio=<x>`.

Prompts: PubMedQA with abstracts (`relevant` variant) from ../shared/data/pubmedqa/ori_pqal.json when
present, else generated BayesX full prompts. `--rss-rows N` also runs `walla-extract` on N generated
facts rows in a subprocess and reports its peak RSS (bounded by streaming shards into the store).
"""

from __future__ import annotations

import argparse
import copy
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
PUBMEDQA = REPO.parent / "shared" / "data" / "pubmedqa" / "ori_pqal.json"


def matmul_peak(dtype: torch.dtype, n: int = 2048, reps: int = 4, tries: int = 3) -> float:
    """Best GFLOP/s of n x n x n GEMMs in `dtype`."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    best = 0.0
    for _ in range(tries):
        t = time.perf_counter()
        for _ in range(reps):
            a @ b
        best = max(best, 2 * n**3 * reps / (time.perf_counter() - t) / 1e9)
    return best


def load_prompts(n: int) -> tuple[list[str], str]:
    from walla.extract.datasets import DatasetRequest, load_dataset_table
    from walla.extract.prompts import build_prompts, get_template
    from walla.extract.splits import SplitProtocol

    if PUBMEDQA.exists():
        req = DatasetRequest(
            "pubmedqa", "pubmedqa", data_file=PUBMEDQA, split_protocol=SplitProtocol("none"), limit=n
        )
        table, _ = load_dataset_table(req)
        name = f"PubMedQA with abstracts ({PUBMEDQA.name})"
        template = get_template("pubmedqa")
    else:
        req = DatasetRequest(
            "bayesx", "bayesx", generator={"n": n, "seed": 42}, split_protocol=SplitProtocol("none")
        )
        table, _ = load_dataset_table(req)
        name = "generated BayesX full prompts"
        template = get_template("bayesx")
    return [p.text for p in build_prompts(table, template, "relevant")], name


def reference_loop(model, tok, prompts: list[str], cand: list[int], batch: int = 5):
    """The reference's two passes per batch (logits + hidden states; perplexity). Returns (opt lp, hidden, time)."""
    tok.padding_side = "left"
    opts, hids = [], []
    t = time.perf_counter()
    with torch.no_grad():
        for i in range(0, len(prompts), batch):
            enc = tok(prompts[i : i + batch], return_tensors="pt", padding=True)
            out = model(**enc, output_hidden_states=True)
            logp = torch.log_softmax(out.logits, dim=-1)  # [B, L, V] full vocabulary, every position
            opts.append(logp[:, -1, cand])
            hids.append(out.hidden_states[-1][:, -1])
            out2 = model(**enc, use_cache=False)  # the separate PackLLM perplexity pass (SPEC §2.3)
            lp2 = torch.log_softmax(out2.logits[:, :-1], dim=-1)  # [B, L-1, V]
            tgt = enc["input_ids"][:, 1:]
            nll = -lp2.gather(-1, tgt[..., None])[..., 0]
            mask = enc["attention_mask"][:, 1:].bool() & (tgt != tok.pad_token_id)
            (nll * mask).sum(1) / mask.sum(1).clamp(min=1)
    return torch.cat(opts).numpy(), torch.cat(hids).numpy(), time.perf_counter() - t


def passes_for_scenario(name: str = "homo-pubmedqa-aloe-x12") -> tuple[int, int]:
    """(reference passes, our passes) over the dataset for a scenario manifest."""
    from walla.store.manifests import load_scenario

    sc = load_scenario(name)
    variants = {
        "none": {"none"},
        "one_relevant": {"none", "relevant"},
        "one_relevant_one_irrelevant": {"none", "relevant", "irrelevant"},
    }[sc.context_rule]
    ours = len({(m, v) for m in sc.agents for v in variants})
    return len(sc.agents), ours


def rss_run(rows: int) -> float:
    """Peak RSS (MiB) of a real walla-extract subprocess on `rows` generated facts rows."""
    with tempfile.TemporaryDirectory() as d:
        cmd = [
            str(REPO / ".venv" / "bin" / "walla-extract"),
            "--model",
            "smollm2-135m",
            "--dataset",
            "facts",
            "--size",
            str(rows),
            "--variants",
            "relevant",
            "--store",
            d,
            "--no-progress",
        ]
        t = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        dt = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"peak RSS of walla-extract on {rows} facts rows (relevant variant): {peak:.0f} MiB ({dt:.0f} s)")
    return peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=48, help="prompts for our backend")
    ap.add_argument("--ref-n", type=int, default=15, help="prompts for the reference-style loop (slow)")
    ap.add_argument("--bf16-n", type=int, default=6, help="prompts for our backend in bf16")
    ap.add_argument("--batch-tokens", type=int, default=8192)
    ap.add_argument("--rss-rows", type=int, default=0, help="also measure peak RSS of a real extraction")
    args = ap.parse_args()
    t_start = time.perf_counter()

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from walla.extract.backends.hf import HFBackend, converted_gguf_dir
    from walla.extract.models import resolve_model
    from walla.store.manifests import load_models

    rm = resolve_model(load_models()["smollm2-135m"])
    src = converted_gguf_dir(Path(rm.load_from) / rm.gguf_file, rm.identity["gguf_sha256"])
    tok = AutoTokenizer.from_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32, attn_implementation="sdpa").eval()
    n_params = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight.numel()
    if model.get_output_embeddings().weight.data_ptr() != model.get_input_embeddings().weight.data_ptr():
        emb += model.get_output_embeddings().weight.numel()
    non_emb = n_params - emb
    prompts, what = load_prompts(args.n)
    print(
        f"model SmolLM2-135M: {n_params / 1e6:.1f}M params, {non_emb / 1e6:.1f}M non-embedding; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(f"prompts: {len(prompts)} x {what}")

    peak32, peak16 = matmul_peak(torch.float32), matmul_peak(torch.bfloat16)

    be = HFBackend(model, tok, batch_tokens=args.batch_tokens)
    cand = [be.encode_bare(t)[0] for t in ("YES", "NO", "1", "0")]
    be.score(prompts[:2], cand)  # warm-up
    t = time.perf_counter()
    res = be.score(prompts, cand)
    dt = time.perf_counter() - t
    tokens = int(res.n_tokens.sum())
    ours_tps = tokens / dt

    m16 = copy.deepcopy(model).to(torch.bfloat16)
    be16 = HFBackend(m16, tok, batch_tokens=args.batch_tokens)
    sub = prompts[: args.bf16_n]
    t = time.perf_counter()
    r16 = be16.score(sub, cand)
    bf16_tps = int(r16.n_tokens.sum()) / (time.perf_counter() - t)
    del m16, be16

    ref_model = AutoModelForCausalLM.from_pretrained(
        src, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    ref_tok = AutoTokenizer.from_pretrained(src)
    ref_prompts = prompts[: args.ref_n]
    ref_opt, ref_hid, ref_dt = reference_loop(ref_model, ref_tok, ref_prompts, cand)
    ref_tps = int(res.n_tokens[: args.ref_n].sum()) / ref_dt
    diff_lp = float(np.abs(ref_opt - res.raw_logprobs[: args.ref_n]).max())
    diff_h = float(np.abs(ref_hid - res.hidden[: args.ref_n]).max())

    peak32, peak16 = max(peak32, matmul_peak(torch.float32)), max(peak16, matmul_peak(torch.bfloat16))
    use_bf16 = bf16_tps > ours_tps
    best_tps, peak = (bf16_tps, peak16) if use_bf16 else (ours_tps, peak32)
    flops_per_token = 2 * non_emb
    mfu = flops_per_token * best_tps / (peak * 1e9)
    mfu_bf16 = flops_per_token * best_tps / (peak16 * 1e9)
    ref_passes, our_passes = passes_for_scenario()

    print(
        f"matmul peak (2048^3 GEMM, this run): fp32 {peak32:.1f} GFLOP/s, bf16 {peak16:.1f} GFLOP/s "
        f"({'native bf16' if peak16 > peak32 else 'no native bf16 on this CPU: bf16 is emulated'})"
    )
    print(
        f"ours fp32 (SDPA, buckets <= {args.batch_tokens} tokens): {tokens} tokens in {dt:.1f} s = {ours_tps:.0f} tok/s "
        f"({len(prompts) / dt:.2f} prompts/s)"
    )
    print(
        f"ours bf16 on {len(sub)} prompts: {bf16_tps:.0f} tok/s -> dtype auto picks "
        f"{'bf16' if use_bf16 else 'fp32'} here"
    )
    print(
        f"MFU = 2 x {non_emb / 1e6:.1f}M x {best_tps:.0f} tok/s / {'bf16' if use_bf16 else 'fp32'} peak "
        f"{peak:.1f} GFLOP/s = {mfu:.3f}   (against the bf16 peak: {mfu_bf16:.3f})"
    )
    print(
        f"  (the prompt-NLL head adds 2 x {emb / 1e6:.1f}M FLOPs/token not counted in MFU: "
        f"utilization incl. it {2 * (non_emb + emb) * best_tps / (peak * 1e9):.3f})"
    )
    print(
        f"reference-style loop (fp32, eager, batch 5, full-vocab log_softmax, + perplexity pass) on "
        f"{len(ref_prompts)} prompts: {ref_tps:.0f} tok/s; speed-up {ours_tps / ref_tps:.2f}x "
        f"(same outputs: max |d option log-prob| {diff_lp:.1e}, max |d hidden| {diff_h:.1e})"
    )
    print(
        f"LLM passes over the dataset, 12-agent homogeneous PubMedQA (homo-pubmedqa-aloe-x12): reference "
        f"{ref_passes} (one per slot), ours {our_passes} (one per distinct model x variant): "
        f"{ref_passes / our_passes:.1f}x fewer"
    )
    if args.rss_rows:
        rss_run(args.rss_rows)
    print(f"benchmark time {time.perf_counter() - t_start:.0f} s")
    print(
        f"RESULT mfu={mfu:.3f} speedup_vs_reference={best_tps / ref_tps:.2f} passes_ratio={ref_passes / our_passes:.1f}"
    )


if __name__ == "__main__":
    sys.exit(main())
