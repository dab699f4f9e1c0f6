"""Extraction throughput at real model shapes: `walla-extract` with default flags vs a bare loop, on any device.

    .venv/bin/python benchmarks/extract_throughput.py --device cuda --model 8b      # an H100: the issue's 8B row
    .venv/bin/python benchmarks/extract_throughput.py --device cpu --model tiny     # this code path on a CPU

Throughput depends on a model's shape, not its weights, so the model is a random-weight Llama of a real
shape (`SHAPES`: Llama-3.2-1B's and Llama-3.1-8B's decoders) with the SmolLM2 tokenizer (49,152 tokens, the
embedded model's), initialised on the device in the benchmark dtype and saved to a scratch directory that
the CLI loads like any local model. The prompts are ARC-Challenge dev questions repeated (new ids) to about
`--tokens` prompt tokens, as in issue 22. Measured in ONE run, same prompts, same dtype:

- `walla-extract` as a subprocess with default flags (batch sizes, compile, batch invariance all `auto`;
  its own lines saying what it chose are printed): whole-command wall time, and extraction time as it
  prints it (prompts, forward passes, prompt NLL, store writes; not the model load or the compile);
- the same command with `--batch-invariant` flipped (on where the default ran padded batches, off where it
  ran invariant): `invariance_cost` = invariant extraction seconds / padded ones, same dtype and prompts,
  and which tier each side ran (bitwise: batch-invariant; batch-recorded: padded, the batch sizes recorded);
- a bare loop: prompts sorted by length, left padding with the attention mask, `logits_to_keep=1`,
  last-layer hidden state, no prompt NLL; device synchronised; at each batch size of `--loop-batch`
  (16,32,64,128,256: a loop at one batch size can flatter the CLI) and the best of them is the baseline;
- the GEMM peak of the dtype on the device (dtype_probe.gemm_gflops at the probe's device size, best of 3);
- MFU = 2 x non-embedding parameters x prompt tokens / seconds / that peak;
- outputs: the CLI's stored option log-probs and hidden states vs the bare loop's (bf16 tolerance below:
  the two batch differently, so reduced precision rounds differently).
Last line: `RESULT device=.. model=.. cli_over_plain_loop=.. cli_wall_over_plain_loop=.. cli_mfu=..
plain_loop_mfu=.. outputs_match=.. tokens=.. dtype=..`.
"""

# ruff: noqa: E402 (run as a script it answers before the imports that load torch)
from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

if __name__ == "__main__":  # a module of extract_throughput.py, which reads the options and runs this flow
    print(
        "extract_shapes.py: run it through benchmarks/extract_throughput.py --model tiny|1b|8b "
        "(--device cpu --model tiny on a CPU; --help there)",
        file=sys.stderr,
    )
    raise SystemExit(2)

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig
from walla.extract import dtype_probe
from walla.extract.backends.hf import DTYPES
from walla.extract.models import converted_gguf_dir, resolve_model
from walla.extract.prompts import get_template, option_strings
from walla.extract.scoring import resolve_option_token_ids
from walla.manifests.catalog import load_models
from walla.store.features import read_feature_set

# decoder shapes (layers, hidden, heads, kv heads, MLP, tied embeddings); the vocabulary is the tokenizer's
SHAPES = {
    "tiny": {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "mlp": 128, "tied": True},
    "1b": {
        "layers": 16,
        "hidden": 2048,
        "heads": 32,
        "kv_heads": 8,
        "mlp": 8192,
        "tied": True,
    },  # Llama-3.2-1B
    "8b": {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "mlp": 14336, "tied": False},  # 3.1-8B
}
DEFAULT_TOKENS = {"tiny": 3_000, "1b": 500_000, "8b": 200_000}  # the 501k / 201k-token jobs
TEMPLATE_TOKENS = 30  # the mc template's own tokens around a question (estimate; the real count is printed)
TOL = {"logprob": 0.1, "hidden": 0.05}  # bf16: max |d option log-prob| (nats), max |d hidden| / max |hidden|


@dataclass
class ShapeRun:
    """What one run measured (seconds are the best of --repeat)."""

    device: str
    model: str
    dtype: str
    peak: float = 0.0  # GEMM GFLOP/s of the dtype on the device
    tokens: int = 0
    n_prompts: int = 0
    non_emb: int = 0
    cli_wall: float = math.inf
    cli_walls: list[float] = field(default_factory=list)  # whole command per run: the first with cold caches
    cli_loads: list[str] = field(default_factory=list)  # the CLI's model-load line per run
    cli_timelines: list[str] = field(default_factory=list)  # where each CLI run's time went (where_it_went)
    cli: float = math.inf  # extraction as the CLI prints it
    loop: float = math.inf
    cli_lines: tuple[str, ...] = ()
    outputs: dict | None = None
    loops: dict[int, float] | None = None  # bare loop seconds per batch size (`loop` is the best)
    cli_other: float = math.inf  # extraction with --batch-invariant flipped
    cli_other_walls: list[float] = field(default_factory=list)  # its whole command per run
    invariant_default: bool | None = None  # did the default-flags run score batch-invariantly
    invariant_scoring: str = "?"  # the invariant side's path: fixed-vN (hf_fixed, CUDA) or 2 (hf_packed, CPU)

    def tps(self, seconds: float) -> float:
        return self.tokens / seconds

    def mfu(self, seconds: float) -> float:
        return 2 * self.non_emb * self.tps(seconds) / (self.peak * 1e9)


def smollm2_tokenizer(path: str | None = None):
    """The embedded SmolLM2-135M's tokenizer (its GGUF converted once into the walla cache), or the one saved
    in `path` (a machine without the embedded model's package, e.g. a GPU host: `--tokenizer DIR`)."""
    if path:
        return AutoTokenizer.from_pretrained(path)
    rm = resolve_model(load_models()["smollm2-135m"])
    src = converted_gguf_dir(Path(rm.load_from) / rm.gguf_file, rm.identity["gguf_sha256"])
    return AutoTokenizer.from_pretrained(src)


def save_random_model(shape: str, tok, dtype: torch.dtype, device: str, out: Path) -> int:
    """A random-weight Llama of `shape`, initialised on `device` in `dtype`, saved with `tok` to `out`.
    Returns its non-embedding parameter count."""
    s = SHAPES[shape]
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=s["hidden"],
        intermediate_size=s["mlp"],
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"],
        tie_word_embeddings=s["tied"],
        max_position_embeddings=8192,
        rope_theta=500_000.0,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    n = sum(p.numel() for p in model.parameters())
    non_emb = n - model.get_input_embeddings().weight.numel()
    if not cfg.tie_word_embeddings:
        non_emb -= model.get_output_embeddings().weight.numel()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    del model
    return non_emb


def repeated_arc(src: Path, tok, tokens: int, out: Path) -> int:
    """ARC dev records repeated (ids suffixed -r<k>) to ~`tokens` prompt tokens, as JSON lines; returns rows."""
    records = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
    texts = [
        r["question"]["stem"] + " " + " ".join(c["text"] for c in r["question"]["choices"]) for r in records
    ]
    per = np.mean([len(ids) for ids in tok(texts)["input_ids"]]) + TEMPLATE_TOKENS
    n = max(1, math.ceil(tokens / per))
    rows = [
        dict(records[i % len(records)], id=f"{records[i % len(records)]['id']}-r{i // len(records)}")
        for i in range(n)
    ]
    out.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return n


def cli_argv() -> list[str]:
    return [sys.executable, "-m", "walla.extract.cli"]


def run_cli(
    model_dir: Path, data: Path, store: Path, dtype: str, device: str, extra: tuple[str, ...] = ()
) -> tuple[float, float, list[str]]:
    """walla-extract with default flags (+ `extra`): (whole wall s, extraction s as printed, its stdout lines)."""
    cmd = [
        *cli_argv(),
        "--model",
        str(model_dir),
        "--dataset",
        "arc-challenge",
        "--data-file",
        str(data),
        *extra,
    ]
    cmd += [
        "--variants",
        "none",
        "--store",
        str(store),
        "--dtype",
        dtype,
        "--device",
        device,
        "--no-progress",
    ]
    return timed_cli(cmd)


def timed_cli(cmd: list[str]) -> tuple[float, float, list[str]]:
    """Run a walla-extract command line: (whole wall s, extraction s as printed, its stdout lines)."""
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"walla-extract failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    # the stderr line saying where the whole command went (walla.extract.timeline) first, the stored path last
    done = [x for x in proc.stderr.splitlines() if x.startswith("walla extract: done in ")]
    lines = done + proc.stdout.splitlines()
    m = next(re.search(r"rows in ([0-9.]+) s", x) for x in lines if x.startswith("wrote "))
    return wall, float(m.group(1)), lines


def where_it_went(wall: float, lines: list[str]) -> str:
    """The CLI's last line (where the command's time went) and what came after it: process exit."""
    done = next((x for x in lines if x.startswith("walla extract: done in ")), None)
    if done is None:
        return "(no timeline line)"
    said = float(re.search(r"done in ([0-9.]+) s", done).group(1))
    return f"{done.removeprefix('walla extract: ')}; then exit {max(0.0, wall - said):.1f} s"


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def bare_loop(model, tok, prompts: list[str], cand: list[int], batch: int = 16, device: str = "cpu"):
    """The bare loop a user would write (the issue's): longest prompts first, left padding, `logits_to_keep=1`,
    last-layer hidden state. Returns (option log-probs [N, U], hidden [N, d], seconds)."""
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    opts, hids = [None] * len(prompts), [None] * len(prompts)
    sync(device)
    t = time.perf_counter()
    with torch.inference_mode():
        for s in range(0, len(order), batch):
            idx = order[s : s + batch]
            enc = tok([prompts[i] for i in idx], return_tensors="pt", padding=True).to(device)
            out = model(**enc, logits_to_keep=1, output_hidden_states=True)
            lp = torch.log_softmax(out.logits[:, -1].float(), dim=-1)[:, cand]  # [B, U]
            hid = out.hidden_states[-1][:, -1].float()  # [B, d]
            for j, i in enumerate(idx):
                opts[i], hids[i] = lp[j], hid[j]
    sync(device)
    seconds = time.perf_counter() - t
    return torch.stack(opts).cpu().numpy(), torch.stack(hids).cpu().numpy(), seconds


def letter_ids(tok, prompts: list[str], n_options: list[int]) -> list[int]:
    """Token ids of the display letters A, B, ... (a row with K options scores the first K), resolved as
    walla-extract resolves option tokens."""
    letters = option_strings(get_template("mc"), max(n_options))

    def encode(text: str) -> list[int]:  # as the hf backend encodes without a chat template
        return tok(text)["input_ids"]

    def encode_bare(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    ids = resolve_option_token_ids(encode, encode_bare, prompts[0], letters)
    return [ids[x] for x in letters]


def compare(
    cli_raw: list[list[float]], cli_hidden: np.ndarray, loop_lp: np.ndarray, loop_hidden: np.ndarray
) -> dict:
    """max |d option log-prob|, max |d hidden| / max |hidden|, min row cosine of the hidden states."""
    d_lp = max(float(np.abs(np.asarray(r) - loop_lp[i, : len(r)]).max()) for i, r in enumerate(cli_raw))
    d_h = float(np.abs(cli_hidden - loop_hidden).max() / (np.abs(loop_hidden).max() + 1e-6))
    cos = (cli_hidden * loop_hidden).sum(1) / (
        np.linalg.norm(cli_hidden, axis=1) * np.linalg.norm(loop_hidden, axis=1) + 1e-12
    )
    ok = d_lp <= TOL["logprob"] and d_h <= TOL["hidden"]
    return {"logprob": d_lp, "hidden": d_h, "cos_min": float(cos.min()), "ok": ok}


def step(text: str) -> None:
    """A measured step as it ends (flushed): a run stopped by a time limit still shows what it measured."""
    print(f"measured: {text}", flush=True)


def measure(args, work: Path, arc_file: Path) -> ShapeRun:
    """Everything of one run, in the order that keeps one model in device memory at a time."""
    device, dtype = args.device, args.dtype
    r = ShapeRun(device=device, model=args.model, dtype=dtype)
    tok = smollm2_tokenizer(getattr(args, "tokenizer", None))
    model_dir, data = work / f"random-{args.model}", work / "arc-repeated.jsonl"
    r.non_emb = save_random_model(args.model, tok, DTYPES[dtype], device, model_dir)
    if sys.flags.dont_write_bytecode:  # e.g. PYTHONDONTWRITEBYTECODE=1 in a GPU host's image
        step(
            "python writes no bytecode here: every process compiles what it imports, whole-command times include it"
        )
    if device.startswith("cuda"):
        torch.cuda.empty_cache()  # the CLI sizes its batches from the memory free now
    r.n_prompts = repeated_arc(arc_file, tok, args.tokens or DEFAULT_TOKENS[args.model], data)
    for i in range(args.repeat):
        store = work / f"store{i}"
        wall, extraction, lines = run_cli(model_dir, data, store, dtype, device)
        r.cli_wall, r.cli, r.cli_lines = min(r.cli_wall, wall), min(r.cli, extraction), tuple(lines)
        r.cli_walls.append(wall)
        step(f"default flags, run {i + 1}: whole command {wall:.2f} s, extraction {extraction:.2f} s")
        r.cli_loads += [x for x in lines if re.match(r"model .* loaded ", x)][:1]
        r.cli_timelines.append(f"default flags, run {i + 1}: {where_it_went(wall, lines)}")
        path = Path(lines[-1].strip())
        if i + 1 < args.repeat:
            shutil.rmtree(store)
    fs = read_feature_set(path)
    r.invariant_default = bool(fs.meta.get("inputs", {}).get("batch_invariant", False))  # what the CLI chose
    flip = "off" if r.invariant_default else "on"
    if r.invariant_default:
        r.invariant_scoring = str(fs.meta["inputs"].get("invariant_scoring", "?"))
    for i in range(args.repeat):
        flip_wall, extraction, flip_lines = run_cli(
            model_dir,
            data,
            work / f"store-flip{i}",
            dtype,
            device,
            ("--backend-arg", f"batch_invariant={flip}"),
        )
        r.cli_other = min(r.cli_other, extraction)
        r.cli_other_walls.append(flip_wall)
        load = [x for x in flip_lines if re.match(r"model .* loaded ", x)][:1]
        r.cli_timelines.append(
            f"--batch-invariant {flip}, run {i + 1}: {where_it_went(flip_wall, flip_lines)}; {' '.join(load)}"
        )
        step(
            f"--batch-invariant {flip}, run {i + 1}: whole command {flip_wall:.2f} s, extraction {extraction:.2f} s"
        )
        if not r.invariant_default and i == 0:
            flipped = read_feature_set(Path(flip_lines[-1].strip()))
            r.invariant_scoring = str(flipped.meta["inputs"].get("invariant_scoring", "?"))
    prompts = fs.rows["prompt"].to_list()
    r.tokens = int(fs.rows["n_prompt_tokens"].sum())
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[dtype], device_map=device).eval()
    cand = letter_ids(tok, prompts, fs.rows["n_options"].to_list())
    sizes = [int(b) for b in str(args.loop_batch).split(",")]
    r.loops = dict.fromkeys(sizes, math.inf)
    bare_loop(model, tok, prompts[: sizes[0]], cand, sizes[0], device)  # warm-up
    for _ in range(args.repeat):
        for b in sizes:
            lp_b, hid_b, seconds = bare_loop(model, tok, prompts, cand, b, device)
            r.loops[b] = min(r.loops[b], seconds)
            step(f"bare loop, batch {b}: {seconds:.2f} s")
            if seconds <= r.loop:
                r.loop, lp, hid = seconds, lp_b, hid_b
    cli_hidden = np.asarray(fs.hidden[:]).astype(np.float32)
    r.outputs = compare(fs.rows["raw_option_logprobs"].to_list(), cli_hidden, lp, hid)
    del model
    r.peak = max(dtype_probe.gemm_gflops(dtype, device) for _ in range(3))
    return r


def report(r: ShapeRun) -> None:
    unit, scale = ("TFLOP/s", 1e3) if r.device.startswith("cuda") else ("GFLOP/s", 1.0)
    where = (
        torch.cuda.get_device_name(r.device)
        if r.device.startswith("cuda")
        else f"{torch.get_num_threads()} threads"
    )
    print(
        f"model: random-weight Llama, {r.model} shape {SHAPES[r.model]}, {r.non_emb / 1e6:.1f}M non-embedding "
        f"params, SmolLM2 tokenizer; {r.dtype} on {r.device} ({where}), torch {torch.__version__}"
    )
    print(f"prompts: {r.n_prompts} ARC-Challenge dev questions (repeated), {r.tokens:,} prompt tokens")
    n = dtype_probe.probe_shape(r.device)[0]
    print(f"GEMM peak ({n}x{n}x{n} {r.dtype} on {r.device}, this run): {r.peak / scale:.1f} {unit}")
    print(
        "walla-extract said: "
        + " | ".join(x for x in r.cli_lines if not x.startswith(("questions:", "  ", "walla extract: done")))
    )
    flipped = "on" if not r.invariant_default else "off"
    rows = (
        *(
            (
                f"walla-extract, default flags, whole command, run {i + 1}"
                + (" (caches cold)" if i == 0 else " (compile + probe caches warm)"),
                w,
            )
            for i, w in enumerate(r.cli_walls)
        ),
        ("walla-extract, default flags, extraction as printed", r.cli),
        *(
            (f"walla-extract --batch-invariant {flipped}, whole command, run {i + 1}", w)
            for i, w in enumerate(r.cli_other_walls)
        ),
        (f"walla-extract --batch-invariant {flipped}, extraction as printed", r.cli_other),
        *((f"bare loop, batch {b} (no prompt NLL)", s) for b, s in (r.loops or {}).items()),
        ("bare loop, best batch (the baseline below)", r.loop),
    )
    width = max(len(what) for what, _ in rows)
    print(f"{'what':<{width}} {'seconds':>8} {'tok/s':>9} {'MFU':>6}")
    for what, s in rows:
        print(f"{what:<{width}} {s:8.2f} {r.tps(s):9.0f} {r.mfu(s):6.3f}")
    inv, pad = (r.cli, r.cli_other) if r.invariant_default else (r.cli_other, r.cli)
    tiers = (
        "default run: bitwise (batch-invariant)"
        if r.invariant_default
        else "default run: batch-recorded (padded)"
    )
    print(
        f"invariance_cost {inv / pad:.2f}: --batch-invariant on {inv:.2f} s (tier bitwise, invariant_scoring "
        f"{r.invariant_scoring}) vs off {pad:.2f} s "
        f"(tier batch-recorded), extraction as printed, same prompts and dtype; {tiers}"
    )
    for i, line in enumerate(r.cli_loads):
        print(f"run {i + 1}: {line}")
    for line in r.cli_timelines:
        print(f"where it went, {line}")
    cold = f" (first run, caches cold: {r.loop / r.cli_walls[0]:.2f}x)" if len(r.cli_walls) > 1 else ""
    print(
        f"CLI vs bare loop ({r.dtype} both): extraction {r.loop / r.cli:.2f}x; whole command incl. start-up, "
        f"model load and compile {r.loop / r.cli_wall:.2f}x{cold}"
    )
    o = r.outputs
    print(
        f"outputs, CLI ({'bitwise tier' if r.invariant_default else 'batch-recorded tier'}) vs bare loop "
        f"(padded batches): max |d option log-prob| {o['logprob']:.2e} (tolerance {TOL['logprob']}), "
        f"max |d hidden| / max |hidden| {o['hidden']:.2e} (tolerance {TOL['hidden']}), min cosine "
        f"{o['cos_min']:.5f}: {'OK' if o['ok'] else 'MISMATCH'}"
    )
    print(
        f"RESULT device={r.device} model={r.model} cli_over_plain_loop={r.loop / r.cli:.2f} "
        f"cli_wall_over_plain_loop={r.loop / r.cli_wall:.2f} cli_mfu={r.mfu(r.cli):.3f} "
        f"plain_loop_mfu={r.mfu(r.loop):.3f} outputs_match={o['ok']} tokens={r.tokens} dtype={r.dtype} "
        f"invariance_cost={inv / pad:.2f}"
    )
