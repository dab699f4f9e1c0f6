"""Extraction throughput: the real CLI vs a bare transformers loop on the same prompts and dtype, and MFU.

    .venv/bin/python benchmarks/extract_throughput.py                  # the CPU default: minutes, no compile
    .venv/bin/python benchmarks/extract_throughput.py --n 64 --compiled   # the old default: past 18 min under load
    .venv/bin/python benchmarks/extract_throughput.py [--n 32] [--ref-n 6] [--other-n 6] [--rss-rows 0]
    .venv/bin/python benchmarks/extract_throughput.py --device cuda [--model 1b|8b] [--tokens 500000]
    .venv/bin/python benchmarks/extract_throughput.py --device cpu --model tiny     # the shape flow, small

`--device cpu` with the embedded SmolLM2-135M (the default) is the detailed CPU run below; by default on 32
PubMedQA records (16 prompts: the "maybe" rows drop, yes/no are balanced to 8 each, split 6/1/1 per class; 24
records leave no test row, which walla extract refuses)
and without the compiled runs (`--compiled` adds them: a CPU compile of the model in the CLI and in-process; the
old default, --n 64 with them, was stopped unfinished after 18 min on the shared 2-core machine at load 12-14).
Every ratio compares the same prompts in the same dtype either way. `--model
tiny|1b|8b` (the default on `--device cuda`: 1b) measures a random-weight Llama of that real shape on ARC
prompts instead (benchmarks/extract_shapes.py: the issue-22 setting): the CLI with default flags vs a bare
loop, MFU against the GEMM peak measured in the same run, outputs compared; the same RESULT ratios
(`cli_over_plain_loop`, `cli_mfu`, `plain_loop_mfu`, `outputs_match`) on either device.

Everything below is measured in ONE run, on the same prompts (PubMedQA with abstracts, the
`relevant` variant, from ../shared/data/pubmedqa/ori_pqal.json). Every speed-up compares two runs in the
SAME dtype on the SAME prompts; going from one dtype to another is its own factor (`dtype_factor`):
- the machine's GEMM peaks per dtype (square GEMMs of 1024 and 2048, best of several, before and after);
- `--dtype auto`: the decision of extract/dtype_probe.py, re-measured here and written to the same
  per-machine cache the CLI reads, so the CLI below makes exactly this decision;
- `walla-extract --dtype auto` as a subprocess (whole command wall time, and its extraction time as it
  prints it: prompts, batching, forward pass, prompt NLL, store writes), eager and (--compiled)
  `--backend-arg compile=on`;
- a bare 15-line transformers loop (`extract_shapes.bare_loop`: batches of 16 sorted by length, left padding,
  `logits_to_keep=1`, hidden states, no prompt NLL) in the auto dtype;
- our hf backend in-process (the extraction fast path without the CLI around it): as the CLI runs it
  (batch-invariant packing in reduced precision, extract/backends/hf/_packed.py), with padded batches
  (`invariance_cost`: padded over packed, same dtype), and (--compiled) compiled (`--backend-arg compile=on`);
- the GEMM ceiling: the model's own linear layers at its own shapes (8192-token batches) timed alone, i.e.
  the MFU the forward would reach if attention, norms, RoPE, activations and the NLL head were free;
- the dtype factor: our backend and the plain loop in both dtypes on the first `--other-n` prompts;
- outputs and the reference: our fp32 path vs a reference-style fp32 loop (SPEC §1.5, §2.3, §10.14:
  eager attention, left padding, full-vocabulary log_softmax via model(...).logits) on `--ref-n` prompts
  must agree to 1e-3 (option log-probs and hidden states); `speedup_vs_reference_fp32` is our fp32 backend
  over that loop on those prompts (fp32 vs fp32);
- the LLM passes over a dataset for the 12-agent homogeneous PubMedQA scenario (reference 12, ours 2).
MFU = 2 x non-embedding params x prompt tokens / time / the measured GEMM peak of the dtype used;
`mfu` is our backend in-process (eager, the default below 300k prompt tokens), `mfu_compiled` compiled (nan
without --compiled, as `cli_compiled_over_plain_loop`; the time breakdown is then the eager backend's),
`cli_mfu` the CLI's extraction, `plain_loop_mfu` the bare loop, `gemm_ceiling_mfu` the GEMM-only bound.
`--repeat N` times CLI, plain loop and backend N times, interleaved, and keeps the best of each.
Last line: `RESULT cli_over_plain_loop=<x> cli_compiled_over_plain_loop=<x> mfu=<x> mfu_compiled=<x>
cli_mfu=<x> plain_loop_mfu=<x> gemm_ceiling_mfu=<x> outputs_match=<bool> speedup_vs_reference_fp32=<x>
dtype_factor=<x> invariance_cost=<x> passes_ratio=<x> dtype=<auto dtype>`.
"""

# ruff: noqa: E402 (the options are read before the imports that load torch)
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from walla.cli.torch_build import device_argument

# --model: the embedded SmolLM2 (the detailed CPU run) or one of extract_shapes.SHAPES
MODELS = ("smollm2", "tiny", "1b", "8b")


def parser() -> argparse.ArgumentParser:
    """The options, built before torch loads: --help and a mistyped flag answer at once (one line, exit 2)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], usage=argparse.SUPPRESS)
    ap.add_argument("--device", default="cpu", type=device_argument, help="cpu | cuda | cuda:N")
    ap.add_argument(
        "--model",
        choices=MODELS,
        help="smollm2 (embedded; cpu only, the default there) or a random-weight shape (default on cuda: 1b)",
    )
    ap.add_argument(
        "--n",
        type=int,
        default=32,
        help="PubMedQA records given to the CLI (maybe rows drop, yes/no balanced)",
    )
    ap.add_argument(
        "--compiled", action="store_true", help="also the compiled runs (CLI compile=on, compiled backend)"
    )
    ap.add_argument("--ref-n", type=int, default=6, help="prompts for the fp32 reference-style output check")
    ap.add_argument("--other-n", type=int, default=6, help="prompts timed in both dtypes (the dtype factor)")
    ap.add_argument("--repeat", type=int, default=1, help="time CLI, plain loop and backend N times (best)")
    ap.add_argument("--rss-rows", type=int, default=0, help="also measure peak RSS of a real extraction")
    ap.add_argument("--tokens", type=int, help="shapes: ARC prompt tokens (default: 1b 500k, 8b 200k)")
    ap.add_argument("--dtype", default="bfloat16", help="shapes: the dtype of the CLI and the loop")
    ap.add_argument(
        "--loop-batch", default="16,32,64,128,256", help="shapes: the bare loop's batch sizes (best)"
    )
    ap.add_argument(
        "--tokenizer", help="shapes: a saved SmolLM2 tokenizer dir (default: the embedded model's)"
    )
    ap.add_argument("--work-dir", help="shapes: where the random model and stores go (default: a temp dir)")
    return ap


if __name__ == "__main__":
    parser().parse_args()

import extract_shapes  # benchmarks/extract_shapes.py: the shape flow (this script's folder is on sys.path)
import numpy as np
import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile
from transformers import AutoModelForCausalLM, AutoTokenizer
from walla.extract import dtype_probe
from walla.extract.backends.hf import DTYPES, HFBackend
from walla.extract.models import converted_gguf_dir, resolve_model
from walla.manifests.catalog import load_models
from walla.manifests.scenario import read_scenario
from walla.store.features import read_feature_set

REPO = Path(__file__).resolve().parents[1]
REAL_DATA = Path(os.environ.get("REAL_DATA", REPO.parent / "shared" / "data"))  # as the Makefile
PUBMEDQA = REAL_DATA / "pubmedqa" / "ori_pqal.json"
CLI = REPO / ".venv" / "bin" / "walla-extract"
OPTIONS = ("YES", "NO")  # the pubmedqa template's option tokens
TOL = 1e-3  # fp32 vs reference-style fp32: option log-probs (abs) and hidden states (abs)
BATCH_TOKENS = 8192  # our backend in-process


def gemm_peak(dtype: str) -> float:
    """Best GFLOP/s of square GEMMs (1024 and 2048, 3 tries each) in `dtype`: the machine's GEMM peak."""
    return max(dtype_probe.gemm_gflops(dtype, "cpu", n=n, reps=3) for n in (1024, 2048) for _ in range(3))


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
    nll = be.token_nll

    def traced_nll(*args):
        with record_function("prompt_nll"):
            return nll(*args)

    be.token_nll = traced_nll
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        be.score(prompts, cand)
        total = time.perf_counter() - t
    be.token_nll = nll
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
    cmd += ["--backend-arg", f"compile={compile_}"]
    return extract_shapes.timed_cli(cmd)


def rss_run(rows: int) -> None:
    """Peak RSS (MiB) of a real walla-extract subprocess on `rows` generated facts rows."""
    with tempfile.TemporaryDirectory() as d:
        cmd = [str(CLI), "--model", "smollm2-135m", "--dataset", "facts", "--size", str(rows)]
        subprocess.run([*cmd, "--variants", "relevant", "--store", d, "--no-progress"], check=True)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"peak RSS of walla-extract on {rows} facts rows (relevant variant): {peak:.0f} MiB")


def load(src: Path, dtype: torch.dtype, attn: str = "sdpa"):
    model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype, attn_implementation=attn).eval()
    return model, AutoTokenizer.from_pretrained(src)


@dataclass
class Run:
    """What one benchmark run measured (seconds are the best of --repeat; tps = tokens per second)."""

    auto: str  # the dtype `auto` chose
    other: str  # the other candidate dtype
    peaks: dict[str, float]  # GEMM GFLOP/s per dtype
    why: str  # the auto decision's one line
    n_prompts: int = 0
    tokens: int = 0
    non_emb: int = 0
    n_params: int = 0
    s: dict[str, float] = field(default_factory=dict)  # seconds by measurement name (all prompts, auto dtype)
    sub: dict[str, float] = field(default_factory=dict)  # tok/s on the first --other-n prompts, per dtype
    ref: dict[str, float] = field(default_factory=dict)  # tok/s on the --ref-n prompts: reference, ours fp32
    outputs: dict[str, float] = field(default_factory=dict)  # max |d| of outputs (see check_outputs)
    compile_s: float = 0.0
    compiled: bool = False  # whether the compiled runs were measured (--compiled)
    passes: tuple[int, int] = (0, 0)
    parts: dict[str, float] = field(default_factory=dict)

    def tps(self, name: str) -> float:
        return self.tokens / self.s[name] if name in self.s else math.nan  # nan: not measured (--compiled)

    @property
    def profiled(self) -> str:
        """The in-process backend whose time is broken down: the compiled one where it was measured."""
        return "compiled" if self.compiled else "ours"

    def mfu(self, name: str, dtype: str | None = None) -> float:
        return 2 * self.non_emb * self.tps(name) / (self.peaks[dtype or self.auto] * 1e9)


def model_counts(model) -> tuple[int, int]:
    """(all parameters, non-embedding parameters: without the input embedding and an untied output head)."""
    n_params = sum(p.numel() for p in model.parameters())
    non_emb = n_params - model.get_input_embeddings().weight.numel()
    if model.get_output_embeddings().weight.data_ptr() != model.get_input_embeddings().weight.data_ptr():
        non_emb -= model.get_output_embeddings().weight.numel()
    return n_params, non_emb


def time_in_process(r: Run, src: Path, subset: Path, tmp: Path, prompts, repeat: int, first_cli: tuple):
    """CLI (eager, and compiled where r.compiled), plain loop, our backend packed / padded (/ compiled), all in
    the auto dtype; `first_cli` (wall s, extraction s) is the CLI run that gave the prompts (round 0).
    Returns (option token ids, the backend to profile: compiled or as the CLI, the plain loop's last outputs)."""
    model, tok = load(src, DTYPES[r.auto])
    # copied before any output_hidden_states call: its hooks break graphs
    m_compiled = copy.deepcopy(model) if r.compiled else None
    r.n_params, r.non_emb = model_counts(model)
    ours = HFBackend(model, tok, batch_tokens=BATCH_TOKENS)  # as the CLI: packed in reduced precision
    padded = HFBackend(model, tok, batch_tokens=BATCH_TOKENS, batch_invariant=False)
    cand = [ours.encode_bare(o)[0] for o in OPTIONS]
    for warm in (ours, padded):
        warm.score(prompts[:2], cand)
    extract_shapes.bare_loop(model, tok, prompts[:2], cand)
    bec = ours
    if r.compiled:
        t = time.perf_counter()
        bec = HFBackend(m_compiled, tok, batch_tokens=BATCH_TOKENS, compiled=True)  # compiles and traces once
        bec.score(prompts[:2], cand)
        r.compile_s = time.perf_counter() - t
    compiled_keys = ["cli_c_wall", "cli_c", "compiled"] if r.compiled else []
    best = dict.fromkeys([*compiled_keys, "loop", "ours", "padded"], np.inf)
    best |= dict(zip(("cli_wall", "cli"), first_cli, strict=True))
    for i in range(repeat):  # interleaved; the best of each counts (a shared machine is noisy)
        cli = run_cli(subset, tmp / f"store{i}")[:2] if i else first_cli
        got = dict(zip(("cli_wall", "cli"), cli, strict=True))
        if r.compiled:
            cli_c = run_cli(subset, tmp / f"store-c{i}", "on")[:2]
            got |= dict(zip(("cli_c_wall", "cli_c"), cli_c, strict=True))
        loop_out = extract_shapes.bare_loop(model, tok, prompts, cand)
        got["loop"] = loop_out[2]
        got["ours"] = _timed(lambda: ours.score(prompts, cand))
        got["padded"] = _timed(lambda: padded.score(prompts, cand))
        if r.compiled:
            got["compiled"] = _timed(lambda: bec.score(prompts, cand))
        best = {k: min(v, got[k]) for k, v in best.items()}
    r.s = best
    r.s["gemm"] = gemm_seconds_per_token(model) * r.tokens
    return cand, bec, loop_out


def time_dtypes(r: Run, src: Path, prompts: list[str], token_counts: list[int], cand: list[int]) -> None:
    """Our backend and the plain loop in BOTH dtypes on the same first --other-n prompts (the dtype factor)."""
    tokens = sum(token_counts)
    for name in (r.auto, r.other):
        model, tok = load(src, DTYPES[name])
        be = HFBackend(model, tok, batch_tokens=BATCH_TOKENS)
        be.score(prompts[:2], cand)
        r.sub[f"ours {name}"] = tokens / _timed(lambda be=be: be.score(prompts, cand))
        r.sub[f"loop {name}"] = tokens / extract_shapes.bare_loop(model, tok, prompts, cand)[2]
        del model, be


def check_outputs(r: Run, src: Path, prompts, token_counts, cand, cli_lp, loop_lp) -> None:
    """fp32: our backend vs the reference-style loop (outputs and speed, same dtype, same prompts), and how far
    the auto dtype's outputs (CLI, plain loop) are from that fp32 reference."""
    ref_opt, ref_hid, ref_dt = reference_loop(*load(src, torch.float32, "eager"), prompts, cand)
    ours32 = HFBackend(*load(src, torch.float32), batch_tokens=BATCH_TOKENS)
    ours32.score(prompts[:2], cand)
    t = time.perf_counter()
    res = ours32.score(prompts, cand)
    ours_dt = time.perf_counter() - t
    r.ref = {"reference fp32": sum(token_counts) / ref_dt, "ours fp32": sum(token_counts) / ours_dt}
    n = len(prompts)
    r.outputs = {
        "lp": float(np.abs(ref_opt - res.raw_logprobs).max()),
        "hidden": float(np.abs(ref_hid - res.hidden).max()),
        "cli_vs_fp32": float(np.abs(cli_lp[:n] - ref_opt).max()),
        "loop_vs_fp32": float(np.abs(loop_lp[:n] - ref_opt).max()),
    }


def print_table(r: Run) -> None:
    print(f"{'what':<68} {'seconds':>8} {'tok/s':>7} {'MFU':>6}")
    rows = [
        ("walla-extract --dtype auto, whole command", "cli_wall"),
        ("walla-extract --dtype auto, extraction as printed", "cli"),
        ("walla-extract --backend-arg compile=on, whole command", "cli_c_wall"),
        ("walla-extract --backend-arg compile=on, extraction as printed", "cli_c"),
        ("our hf backend in-process, as the CLI (with prompt NLL)", "ours"),
        ("our hf backend in-process, padded batches", "padded"),
        ("our hf backend in-process, compiled", "compiled"),
        ("the decoder's linear layers alone (GEMM ceiling)", "gemm"),
        ("plain transformers loop (no prompt NLL)", "loop"),
    ]
    for what, key in rows:
        if key not in r.s:
            print(f"{what + ' [' + r.auto + ']':<68} not measured (--compiled)")
            continue
        print(f"{what + ' [' + r.auto + ']':<68} {r.s[key]:8.1f} {r.tps(key):7.0f} {r.mfu(key):6.3f}")


def print_ratios(r: Run, other_n: int, ref_n: int) -> None:
    """Every ratio at one dtype on both sides; the dtype change is printed as its own factor."""
    a, o = r.auto, r.other
    print(
        f"dtype factor ({a} over {o}, same {other_n} prompts): our backend "
        f"{r.sub[f'ours {a}'] / r.sub[f'ours {o}']:.2f}x ({r.sub[f'ours {a}']:.0f} vs {r.sub[f'ours {o}']:.0f} "
        f"tok/s), plain loop {r.sub[f'loop {a}'] / r.sub[f'loop {o}']:.2f}x; auto chose {a}"
    )
    print(
        f"CLI vs plain loop ({a} both): extraction {r.tps('cli') / r.tps('loop'):.2f}x "
        f"({r.tps('cli'):.0f} / {r.tps('loop'):.0f} tok/s); whole command incl. start-up and model load "
        f"{r.tps('cli_wall') / r.tps('loop'):.2f}x"
    )
    print(
        f"batch invariance ({a} both): padded batches {r.tps('padded') / r.tps('ours'):.2f}x the packed, "
        f"batch-invariant scoring"
    )
    if r.compiled:
        print(
            f"compiled backend ({a} both): compile + first trace {r.compile_s:.1f} s in-process (once per "
            f"process; the CLI's load line includes it); compiled vs eager {r.tps('compiled') / r.tps('ours'):.2f}x"
        )
    else:
        print("compiled runs (CLI compile=on, compiled backend) not measured: --compiled adds them")
    ok = r.outputs["lp"] <= TOL and r.outputs["hidden"] <= TOL
    print(
        f"fp32 fast path vs reference-style fp32 loop on {ref_n} prompts: max |d option log-prob| "
        f"{r.outputs['lp']:.1e}, max |d hidden| {r.outputs['hidden']:.1e} (tolerance {TOL}): "
        f"{'OK' if ok else 'MISMATCH'}"
    )
    print(
        f"{a} vs that fp32 reference, max |d option log-prob|: CLI {r.outputs['cli_vs_fp32']:.1e}, plain loop "
        f"{r.outputs['loop_vs_fp32']:.1e} (the dtype's own rounding, the same for both)"
    )
    speed = r.ref["ours fp32"] / r.ref["reference fp32"]
    print(
        f"reference-style loop (fp32, eager, batch 5, full-vocab log_softmax + perplexity pass) on {ref_n} "
        f"prompts: {r.ref['reference fp32']:.0f} tok/s; our fp32 backend {speed:.2f}x that (fp32 both)"
    )
    print(
        f"LLM passes over the dataset, homo-pubmedqa-aloe-x12: reference {r.passes[0]} (one per slot), "
        f"ours {r.passes[1]} (one per distinct model x variant)"
    )
    print(
        f"GEMM share: the decoder's linear layers alone run at {2 * r.non_emb * r.tps('gemm') / 1e9:.0f} "
        f"GFLOP/s and take {r.s['gemm']:.1f} s of the {r.profiled} backend's {r.s[r.profiled]:.1f} s "
        f"({r.s['gemm'] / r.s[r.profiled]:.0%}); the rest is attention (SDPA), norms, RoPE, activations and "
        "the prompt-NLL head (not counted in MFU)"
    )
    total = r.parts["total (under the profiler)"]
    shares = [
        f"{k} {v:.2f} s" + ("" if k.startswith("total") else f" ({v / total:.0%})")
        for k, v in r.parts.items()
    ]
    print(f"where the {r.profiled} backend's time goes: " + ", ".join(shares))


def result_line(r: Run) -> str:
    ok = r.outputs["lp"] <= TOL and r.outputs["hidden"] <= TOL
    a, o = r.auto, r.other
    return (
        f"RESULT cli_over_plain_loop={r.tps('cli') / r.tps('loop'):.2f} "
        f"cli_compiled_over_plain_loop={r.tps('cli_c') / r.tps('loop'):.2f} mfu={r.mfu('ours'):.3f} "
        f"mfu_compiled={r.mfu('compiled'):.3f} cli_mfu={r.mfu('cli'):.3f} plain_loop_mfu={r.mfu('loop'):.3f} "
        f"gemm_ceiling_mfu={r.mfu('gemm'):.3f} outputs_match={ok} "
        f"speedup_vs_reference_fp32={r.ref['ours fp32'] / r.ref['reference fp32']:.2f} "
        f"dtype_factor={r.sub[f'ours {a}'] / r.sub[f'ours {o}']:.2f} "
        f"invariance_cost={r.tps('padded') / r.tps('ours'):.2f} "
        f"passes_ratio={r.passes[0] / r.passes[1]:.1f} dtype={a}"
    )


def parse_args() -> argparse.Namespace:
    ap = parser()
    args = ap.parse_args()
    assert set(MODELS[1:]) == set(extract_shapes.SHAPES), "MODELS lists extract_shapes.SHAPES"
    args.model = args.model or ("1b" if args.device.startswith("cuda") else "smollm2")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: no CUDA GPU is usable here (torch {torch.__version__})")
    if args.model == "smollm2" and args.device != "cpu":
        ap.error("--model smollm2 (the detailed CPU run) is CPU-only; on a GPU use --model 1b, 8b or tiny")
    return args


def main_shapes(args: argparse.Namespace) -> None:
    """The shape flow (benchmarks/extract_shapes.py) on --device."""
    arc = REAL_DATA / "arc" / "ARC-Challenge-Dev.jsonl"
    if not arc.exists():
        raise SystemExit(f"needs the ARC-Challenge dev file at {arc} (set REAL_DATA)")
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=args.work_dir) as d:
        r = extract_shapes.measure(args, Path(d), arc)
    print(f"benchmark time {time.perf_counter() - t_start:.0f} s")
    extract_shapes.report(r)


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Says how long a part of the run took as it ends (a run stopped by a time limit keeps the lines)."""
    t = time.perf_counter()
    yield
    print(f"done: {name} in {time.perf_counter() - t:.1f} s", flush=True)


def main() -> None:
    args = parse_args()
    if args.model != "smollm2":
        return main_shapes(args)
    if not PUBMEDQA.exists():
        raise SystemExit(f"needs the PubMedQA release file at {PUBMEDQA}")
    t_start = time.perf_counter()
    rm = resolve_model(load_models()["smollm2-135m"])
    src = converted_gguf_dir(Path(rm.load_from) / rm.gguf_file, rm.identity["gguf_sha256"])

    # 1. peaks and the auto decision (the same function and cache the CLI uses) -------------------------
    with phase("GEMM peaks and the auto dtype"):
        peaks = {d: gemm_peak(d) for d in ("float32", "bfloat16")}
        choice = dtype_probe.probe("cpu", dtype_probe.default_cache_dir(), refresh=True)
    other = "float32" if choice.dtype != "float32" else "bfloat16"
    r = Run(auto=choice.dtype, other=other, peaks=peaks, why=choice.why(), compiled=args.compiled)

    # 2. the real CLI once for its prompts and outputs, then everything in the auto dtype ----------------
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        records = json.loads(PUBMEDQA.read_text())
        subset = tmp / "ori_pqal_subset.json"
        subset.write_text(json.dumps(dict(list(records.items())[: args.n])))
        with phase("walla extract, first run"):
            wall, dt, lines = run_cli(subset, tmp / "store-prompts")
        fs = read_feature_set(Path(lines[-1].strip()))
        prompts = fs.rows["prompt"].to_list()
        counts = fs.rows["n_prompt_tokens"].to_list()
        r.n_prompts, r.tokens = len(prompts), int(sum(counts))
        cli_lp = np.array(fs.rows["raw_option_logprobs"].to_list(), dtype=np.float32)  # [N, 2] YES, NO
        with phase(f"CLI, bare loop and backend runs ({r.n_prompts} prompts, --repeat {args.repeat})"):
            cand, bec, loop_out = time_in_process(r, src, subset, tmp, prompts, args.repeat, (wall, dt))

    # 3. the dtype factor, the fp32 reference, the profile ------------------------------------------------
    with phase(f"both dtypes on {min(args.other_n, r.n_prompts)} prompts"):
        time_dtypes(r, src, prompts[: args.other_n], counts[: args.other_n], cand)
    with phase(f"the fp32 reference on {min(args.ref_n, r.n_prompts)} prompts"):
        check_outputs(r, src, prompts[: args.ref_n], counts[: args.ref_n], cand, cli_lp, loop_out[0])
    with phase("LLM passes and the GEMM peaks again"):
        r.passes = passes_for_scenario()
        r.peaks = {k: max(v, gemm_peak(k)) for k, v in r.peaks.items()}
    with phase(f"the {r.profiled} backend under the profiler"):
        r.parts = time_breakdown(bec, prompts, cand)

    print(
        f"model SmolLM2-135M: {r.n_params / 1e6:.1f}M params, {r.non_emb / 1e6:.1f}M non-embedding; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(f"prompts: {r.n_prompts} PubMedQA questions with abstracts (relevant variant), {r.tokens} tokens")
    print(
        f"GEMM peak (square 1024/2048, this run): float32 {r.peaks['float32']:.0f} GFLOP/s, "
        f"bfloat16 {r.peaks['bfloat16']:.0f} GFLOP/s"
    )
    print(f"dtype auto -> {r.why}")
    print_table(r)
    print_ratios(r, min(args.other_n, r.n_prompts), min(args.ref_n, r.n_prompts))
    if args.rss_rows:
        rss_run(args.rss_rows)
    print(f"benchmark time {time.perf_counter() - t_start:.0f} s")
    print(result_line(r))


if __name__ == "__main__":
    sys.exit(main())
