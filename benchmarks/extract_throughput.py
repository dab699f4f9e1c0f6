"""Extraction throughput on the embedded SmolLM2-135M: the real CLI vs a bare transformers loop, and MFU.

    .venv/bin/python benchmarks/extract_throughput.py [--n 64] [--ref-n 6] [--rss-rows 0]

Everything below is measured in ONE run, on the same prompts (PubMedQA with abstracts, the
`relevant` variant, from ../shared/data/pubmedqa/ori_pqal.json):
- the machine's GEMM peaks per dtype (square GEMMs of 1024 and 2048, best of several, before and after);
- `--dtype auto`: the decision of extract/dtype_probe.py, re-measured here and written to the same
  per-machine cache the CLI reads, so the CLI below makes exactly this decision;
- `walla-extract --dtype auto` as a subprocess (whole command wall time, and its extraction time as it
  prints it: prompts, batching, forward pass, prompt NLL, store writes);
- a bare 15-line transformers loop (`plain_loop`: batches of 16 sorted by length, left padding,
  `logits_to_keep=1`, hidden states, no prompt NLL) in the auto dtype on all prompts and in the other
  dtype on a few, so "the dtype the machine runs fastest" is shown, not assumed;
- our hf backend in-process (the extraction fast path without the CLI around it), eager and compiled
  (`--compile on`: regional torch.compile of the decoder layers), and the CLI with `--compile on`;
- the GEMM ceiling: the model's own linear layers at its own shapes (8192-token batches) timed alone, i.e.
  the MFU the forward would reach if attention, norms, RoPE, activations and the NLL head were free;
- outputs: our fp32 path vs a reference-style fp32 loop (SPEC §1.5, §2.3, §10.14: eager attention, left
  padding, full-vocabulary log_softmax via model(...).logits) must agree to 1e-3 (option log-probs and
  hidden states); the CLI's stored outputs vs the plain loop in the same dtype are printed.
- the LLM passes over a dataset for the 12-agent homogeneous PubMedQA scenario (reference 12, ours 2).
MFU = 2 x non-embedding params x prompt tokens / time / the measured GEMM peak of the dtype used;
`mfu` is our backend in-process (eager, the default below 300k prompt tokens), `mfu_compiled` compiled,
`cli_mfu` the CLI's extraction, `plain_loop_mfu` the bare loop, `gemm_ceiling_mfu` the GEMM-only bound.
`--repeat N` times CLI, plain loop and backend N times, interleaved, and keeps the best of each.
Last line: `RESULT cli_over_plain_loop=<x> cli_compiled_over_plain_loop=<x> mfu=<x> mfu_compiled=<x>
cli_mfu=<x> plain_loop_mfu=<x> gemm_ceiling_mfu=<x> outputs_match=<bool> speedup_vs_reference=<x> passes_ratio=<x>`.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from functools import partial
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
PUBMEDQA = REPO.parent / "shared" / "data" / "pubmedqa" / "ori_pqal.json"
CLI = REPO / ".venv" / "bin" / "walla-extract"
OPTIONS = ("YES", "NO")  # the pubmedqa template's option tokens
TOL = 1e-3  # fp32 vs reference-style fp32: option log-probs (abs) and hidden states (abs)


def gemm_peak(dtype: str) -> float:
    """Best GFLOP/s of square GEMMs (1024 and 2048, 3 tries each) in `dtype`: the machine's GEMM peak."""
    from walla.extract.dtype_probe import gemm_gflops

    return max(gemm_gflops(dtype, "cpu", n=n, reps=3) for n in (1024, 2048) for _ in range(3))


def plain_loop(model, tok, prompts: list[str], cand: list[int], batch: int = 16):
    """The bare loop a user would write. Returns (option log-probs [N, U], hidden [N, d], seconds)."""
    tok.padding_side = "left"
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    opts, hids = [None] * len(prompts), [None] * len(prompts)
    t = time.perf_counter()
    with torch.inference_mode():
        for s in range(0, len(order), batch):
            idx = order[s : s + batch]
            enc = tok([prompts[i] for i in idx], return_tensors="pt", padding=True)
            out = model(**enc, logits_to_keep=1, output_hidden_states=True)
            lp = torch.log_softmax(out.logits[:, -1].float(), dim=-1)[:, cand]  # [B, U]
            for j, i in enumerate(idx):
                opts[i], hids[i] = lp[j], out.hidden_states[-1][j, -1].float()
    return torch.stack(opts).numpy(), torch.stack(hids).numpy(), time.perf_counter() - t


def reference_loop(model, tok, prompts: list[str], cand: list[int], batch: int = 5):
    """The reference's two passes per batch (fp32, eager, left padding, full-vocabulary log_softmax over every
    position; then the separate PackLLM perplexity pass, SPEC §2.3). Returns (opt lp, hidden, seconds)."""
    tok.padding_side = "left"
    opts, hids = [], []
    t = time.perf_counter()
    with torch.no_grad():
        for i in range(0, len(prompts), batch):
            enc = tok(prompts[i : i + batch], return_tensors="pt", padding=True)
            out = model(**enc, output_hidden_states=True)
            opts.append(torch.log_softmax(out.logits, dim=-1)[:, -1, cand])  # [B, L, V] -> [B, U]
            hids.append(out.hidden_states[-1][:, -1])
            lp2 = torch.log_softmax(model(**enc, use_cache=False).logits[:, :-1], dim=-1)  # [B, L-1, V]
            tgt = enc["input_ids"][:, 1:]
            mask = enc["attention_mask"][:, 1:].bool() & (tgt != tok.pad_token_id)
            (-lp2.gather(-1, tgt[..., None])[..., 0] * mask).sum(1) / mask.sum(1).clamp(min=1)
    return torch.cat(opts).numpy(), torch.cat(hids).numpy(), time.perf_counter() - t


def passes_for_scenario(name: str = "homo-pubmedqa-aloe-x12") -> tuple[int, int]:
    """(reference passes, our passes) over the dataset for a scenario manifest."""
    from walla.manifests.scenario import read_scenario

    sc = read_scenario(name).spec
    variants = {"none": 1, "one_relevant": 2, "one_relevant_one_irrelevant": 3}[sc.context_rule]
    return len(sc.agents), len(set(sc.agents)) * variants


def gemm_seconds_per_token(model, batch_tokens: int = 8192) -> float:
    """Seconds per token of the decoder's linear layers alone: each distinct (in, out) shape timed on a
    [batch_tokens, in] input in the model's dtype (best of 3) times how often the model has it."""
    dtype = next(model.parameters()).dtype
    shapes = Counter(
        (m.in_features, m.out_features)
        for m in model.get_decoder().modules()
        if isinstance(m, torch.nn.Linear)
    )
    total = 0.0
    with torch.inference_mode():
        for (i, o), count in shapes.items():
            x, w = torch.randn(batch_tokens, i, dtype=dtype), torch.randn(o, i, dtype=dtype)
            torch.nn.functional.linear(x, w)
            total += count * min(_timed(partial(torch.nn.functional.linear, x, w)) for _ in range(3))
    return total / batch_tokens


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def time_breakdown(be, prompts: list[str], cand: list[int]) -> dict[str, float]:
    """Seconds of one score() call by kind (torch.profiler): the decoder's GEMMs, attention, the prompt-NLL
    head (its GEMM + cross-entropy), and everything else (norms, RoPE, activations, residuals, glue)."""
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile

    nll = be._token_nll

    def traced_nll(*args):
        with record_function("prompt_nll"):
            return nll(*args)

    be._token_nll = traced_nll
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        be.score(prompts, cand)
        total = time.perf_counter() - t
    be._token_nll = nll
    events = prof.events()
    spans = [(e.time_range.start, e.time_range.end) for e in events if e.name == "prompt_nll"]
    out = {
        "decoder GEMMs": 0.0,
        "attention (SDPA)": 0.0,
        "prompt-NLL head": sum(b - a for a, b in spans) / 1e6,
    }
    for e in events:
        in_nll = any(a <= e.time_range.start < b for a, b in spans)
        if e.name in ("aten::mm", "aten::addmm", "aten::bmm") and not in_nll:
            out["decoder GEMMs"] += e.self_cpu_time_total / 1e6
        elif "scaled_dot_product" in e.name and e.name.startswith("aten::_"):
            out["attention (SDPA)"] += e.self_cpu_time_total / 1e6
    out["everything else"] = max(0.0, total - sum(out.values()))
    return {"total (under the profiler)": total, **out}


def run_cli(data_file: Path, store: Path, compile_: str = "auto") -> tuple[float, float, list[str]]:
    """walla-extract --dtype auto as a subprocess: (whole wall s, extraction s as printed, its stdout lines)."""
    cmd = [
        str(CLI),
        "--model",
        "smollm2-135m",
        "--dataset",
        "pubmedqa-labeled",
        "--data-file",
        str(data_file),
    ]
    cmd += ["--variants", "relevant", "--store", str(store), "--dtype", "auto", "--no-progress"]
    cmd += ["--compile", compile_]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"walla-extract failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    lines = proc.stdout.splitlines()
    m = next(re.search(r"rows in ([0-9.]+) s", x) for x in lines if x.startswith("wrote "))
    return wall, float(m.group(1)), lines


def rss_run(rows: int) -> None:
    """Peak RSS (MiB) of a real walla-extract subprocess on `rows` generated facts rows."""
    with tempfile.TemporaryDirectory() as d:
        cmd = [str(CLI), "--model", "smollm2-135m", "--dataset", "facts", "--size", str(rows)]
        subprocess.run([*cmd, "--variants", "relevant", "--store", d, "--no-progress"], check=True)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"peak RSS of walla-extract on {rows} facts rows (relevant variant): {peak:.0f} MiB")


def load(src: Path, dtype: torch.dtype, attn: str = "sdpa"):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype, attn_implementation=attn).eval()
    return model, AutoTokenizer.from_pretrained(src)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=64, help="PubMedQA records given to the CLI (maybe rows drop)")
    ap.add_argument("--ref-n", type=int, default=6, help="prompts for the fp32 reference-style output check")
    ap.add_argument("--other-n", type=int, default=16, help="prompts for the plain loop in the other dtype")
    ap.add_argument("--repeat", type=int, default=1, help="time CLI, plain loop and backend N times (best)")
    ap.add_argument("--rss-rows", type=int, default=0, help="also measure peak RSS of a real extraction")
    args = ap.parse_args()
    if not PUBMEDQA.exists():
        raise SystemExit(f"needs the PubMedQA release file at {PUBMEDQA}")
    t_start = time.perf_counter()
    from walla.extract import dtype_probe
    from walla.extract.backends.hf import DTYPES, HFBackend, cache_root, converted_gguf_dir
    from walla.extract.models import resolve_model
    from walla.manifests.catalog import load_models
    from walla.store.featureset import read_feature_set

    rm = resolve_model(load_models()["smollm2-135m"])
    src = converted_gguf_dir(Path(rm.load_from) / rm.gguf_file, rm.identity["gguf_sha256"])

    # 1. peaks and the auto decision (the same function and cache the CLI uses) -------------------------
    peaks = {d: gemm_peak(d) for d in ("float32", "bfloat16")}
    choice = dtype_probe.probe("cpu", cache_root() / "dtype-probe", refresh=True)
    auto = choice.dtype
    other = "float32" if auto != "float32" else "bfloat16"

    # 2. the real CLI, then its prompts and outputs from the store ---------------------------------------
    tmp = tempfile.TemporaryDirectory()
    records = json.loads(PUBMEDQA.read_text())
    subset = Path(tmp.name) / "ori_pqal_subset.json"
    subset.write_text(json.dumps(dict(list(records.items())[: args.n])))
    cli_wall, cli_dt, cli_lines = run_cli(subset, Path(tmp.name) / "store0")
    fs = read_feature_set(Path(cli_lines[-1].strip()))
    prompts = fs.rows["prompt"].to_list()
    tokens = int(fs.rows["n_prompt_tokens"].sum())
    cli_lp = np.array(fs.rows["raw_option_logprobs"].to_list(), dtype=np.float32)  # [N, 2] YES, NO
    cli_h = np.asarray(fs.hidden[:]).astype(np.float32)  # [N, d] stored as float16

    # 3. the plain loop (auto dtype on all prompts, the other dtype on a few) and our backend in-process --
    model, tok = load(src, DTYPES[auto])
    m_compiled = copy.deepcopy(model)  # copied before any output_hidden_states call: its hooks break graphs
    n_params = sum(p.numel() for p in model.parameters())
    non_emb = n_params - model.get_input_embeddings().weight.numel()
    if model.get_output_embeddings().weight.data_ptr() != model.get_input_embeddings().weight.data_ptr():
        non_emb -= model.get_output_embeddings().weight.numel()
    be = HFBackend(model, tok, batch_tokens=8192)
    cand = [be.encode_bare(o)[0] for o in OPTIONS]
    plain_loop(model, tok, prompts[:2], cand)  # warm-up
    be.score(prompts[:2], cand)
    t = time.perf_counter()
    bec = HFBackend(m_compiled, tok, batch_tokens=8192, compiled=True)  # compiles and traces once
    bec.score(prompts[:2], cand)
    compile_s = time.perf_counter() - t
    loop_dt = ours_dt = comp_dt = clic_dt = clic_wall = float("inf")
    for r in range(args.repeat):  # interleaved; the best of each counts (a shared machine is noisy)
        if r:
            w, x, _ = run_cli(subset, Path(tmp.name) / f"store{r}")
            cli_wall, cli_dt = min(cli_wall, w), min(cli_dt, x)
        loop_lp, loop_h, dt = plain_loop(model, tok, prompts, cand)
        loop_dt = min(loop_dt, dt)
        ours_dt = min(ours_dt, _timed(lambda: be.score(prompts, cand)))
        comp_dt = min(comp_dt, _timed(lambda: bec.score(prompts, cand)))
        w, x, _ = run_cli(subset, Path(tmp.name) / f"store-c{r}", "on")
        clic_wall, clic_dt = min(clic_wall, w), min(clic_dt, x)
    tmp.cleanup()
    gemm_spt = gemm_seconds_per_token(model)
    m_other, tok_other = load(src, DTYPES[other])
    sub = prompts[: args.other_n]
    sub_tokens = int(fs.rows["n_prompt_tokens"][: args.other_n].sum())
    other_dt = plain_loop(m_other, tok_other, sub, cand)[2]
    del m_other

    # 4. outputs: fp32 fast path vs the reference-style fp32 loop -------------------------------------------
    m32, tok32 = load(src, torch.float32)
    ref_opt, ref_hid, ref_dt = reference_loop(*load(src, torch.float32, "eager"), prompts[: args.ref_n], cand)
    ref_tps = int(fs.rows["n_prompt_tokens"][: args.ref_n].sum()) / ref_dt
    r32 = HFBackend(m32, tok32, batch_tokens=8192).score(prompts[: args.ref_n], cand)
    d_lp, d_h = float(np.abs(ref_opt - r32.raw_logprobs).max()), float(np.abs(ref_hid - r32.hidden).max())
    ok = d_lp <= TOL and d_h <= TOL
    # how far the auto dtype itself is from fp32, for our path and the plain loop alike (context for the CLI)
    d_auto = [float(np.abs(x[: args.ref_n] - ref_opt).max()) for x in (cli_lp, loop_lp)]
    ref_passes, our_passes = passes_for_scenario()

    peaks = {k: max(v, gemm_peak(k)) for k, v in peaks.items()}
    flop = 2 * non_emb * tokens  # model FLOPs of the prompts (non-embedding)
    peak = peaks[auto]

    def mfu(seconds: float) -> float:
        return flop / seconds / (peak * 1e9)

    loop_tps, ours_tps, cli_tps = tokens / loop_dt, tokens / ours_dt, tokens / cli_dt
    comp_tps, clic_tps = tokens / comp_dt, tokens / clic_dt
    other_tps = sub_tokens / other_dt
    print(f"model SmolLM2-135M: {n_params / 1e6:.1f}M params, {non_emb / 1e6:.1f}M non-embedding; torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads")  # fmt: skip
    print(f"prompts: {len(prompts)} PubMedQA questions with abstracts (relevant variant), {tokens} tokens")
    print(f"GEMM peak (square 1024/2048, this run): float32 {peaks['float32']:.0f} GFLOP/s, "
          f"bfloat16 {peaks['bfloat16']:.0f} GFLOP/s")  # fmt: skip
    print(f"dtype auto -> {choice.why()}")
    print(f"{'what':<58} {'seconds':>8} {'tok/s':>7} {'MFU':>6}")
    rows = [
        ("walla-extract --dtype auto, whole command", auto, cli_wall, tokens / cli_wall),
        ("walla-extract --dtype auto, extraction as printed", auto, cli_dt, cli_tps),
        ("walla-extract --compile on, whole command", auto, clic_wall, tokens / clic_wall),
        ("walla-extract --compile on, extraction as printed", auto, clic_dt, clic_tps),
        ("our hf backend in-process (with prompt NLL)", auto, ours_dt, ours_tps),
        ("our hf backend in-process, compiled", auto, comp_dt, comp_tps),
        ("the decoder's linear layers alone (GEMM ceiling)", auto, gemm_spt * tokens, 1 / gemm_spt),
        ("plain transformers loop (no prompt NLL)", auto, loop_dt, loop_tps),
        (f"plain transformers loop, {len(sub)} prompts", other, other_dt, other_tps),
    ]
    for what, dt_name, s, tps in rows:
        u = 2 * non_emb * tps / (peaks[dt_name] * 1e9)
        print(f"{what + ' [' + dt_name + ']':<58} {s:8.1f} {tps:7.0f} {u:6.3f}")
    print(f"fastest dtype of the plain loop here: {auto if loop_tps >= other_tps else other} "
          f"({auto} {loop_tps:.0f} vs {other} {other_tps:.0f} tok/s); auto chose {auto}")  # fmt: skip
    print(f"CLI outputs ({auto}, hidden stored float16) vs plain loop ({auto}): max |d option log-prob| "
          f"{np.abs(cli_lp - loop_lp).max():.1e}, max |d hidden| {np.abs(cli_h - loop_h).max():.1e}")  # fmt: skip
    print(f"fp32 fast path vs reference-style fp32 loop on {args.ref_n} prompts: max |d option log-prob| "
          f"{d_lp:.1e}, max |d hidden| {d_h:.1e} (tolerance {TOL}): {'OK' if ok else 'MISMATCH'}")  # fmt: skip
    print(f"{auto} vs that fp32 reference, max |d option log-prob|: CLI {d_auto[0]:.1e}, plain loop "
          f"{d_auto[1]:.1e} (the dtype's own rounding, the same for both)")  # fmt: skip
    print(f"reference-style loop (fp32, eager, batch 5, full-vocab log_softmax + perplexity pass) on {args.ref_n} "
          f"prompts: {ref_tps:.0f} tok/s; ours in-process {ours_tps / ref_tps:.2f}x that")  # fmt: skip
    print(f"LLM passes over the dataset, homo-pubmedqa-aloe-x12: reference {ref_passes} (one per slot), "
          f"ours {our_passes} (one per distinct model x variant)")  # fmt: skip
    print(f"cli_over_plain_loop = CLI extraction tok/s / plain loop tok/s = {cli_tps:.0f} / {loop_tps:.0f}; "
          f"whole command incl. start-up and model load: {tokens / cli_wall / loop_tps:.2f}")  # fmt: skip
    print(f"compiled backend: compile + first trace {compile_s:.1f} s in-process (once per process; the CLI's "
          f"load line includes it); compiled vs eager in-process {comp_tps / ours_tps:.2f}x")  # fmt: skip
    print(f"GEMM share: the decoder's linear layers alone run at {2 * non_emb / gemm_spt / 1e9:.0f} GFLOP/s and take "
          f"{gemm_spt * tokens:.1f} s of the compiled backend's {comp_dt:.1f} s ({gemm_spt * tokens / comp_dt:.0%}); the "
          f"rest is attention (SDPA), norms, RoPE, activations and the prompt-NLL head (not counted in MFU)")  # fmt: skip
    parts = time_breakdown(bec, prompts, cand)
    print("where the compiled backend's time goes: " + ", ".join(
        f"{k} {v:.2f} s" + ("" if k.startswith("total") else f" ({v / parts['total (under the profiler)']:.0%})")
        for k, v in parts.items()))  # fmt: skip
    if args.rss_rows:
        rss_run(args.rss_rows)
    print(f"benchmark time {time.perf_counter() - t_start:.0f} s")
    print(f"RESULT cli_over_plain_loop={cli_tps / loop_tps:.2f} cli_compiled_over_plain_loop={clic_tps / loop_tps:.2f} "
          f"mfu={mfu(ours_dt):.3f} mfu_compiled={mfu(comp_dt):.3f} cli_mfu={mfu(cli_dt):.3f} "
          f"plain_loop_mfu={mfu(loop_dt):.3f} gemm_ceiling_mfu={mfu(gemm_spt * tokens):.3f} outputs_match={ok} "
          f"speedup_vs_reference={ours_tps / ref_tps:.2f} passes_ratio={ref_passes / our_passes:.1f}")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
