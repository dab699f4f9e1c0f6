"""Training speed with the paper's heads on a synthetic 12-agent scenario (N = 1,000, 8:1:1, H = 576, K = 2).

    .venv/bin/python benchmarks/train_speed.py                  # the CPU default: minutes (2 seeds, 1 epoch, no section 6)
    .venv/bin/python benchmarks/train_speed.py --seeds 5 --all-methods   # the paper's 5 seeds and every method
    .venv/bin/python benchmarks/train_speed.py [--device cpu|cuda] [--seeds 5] [--epochs 2] [--skip-all]
    .venv/bin/python benchmarks/train_speed.py --only-step --step-heads 12    # section 2 alone (CPU)
    .venv/bin/python benchmarks/train_speed.py --device cuda --only-share      # section 7 alone
    .venv/bin/python benchmarks/train_speed.py --device cuda --only-share --cli  # 7, then the command (8)
    .venv/bin/python benchmarks/train_speed.py --only-share --hidden 4096 --agents 12 --rows 1126  # paper, CPU

Every section runs on `--device` (default cpu) except section 2, a CPU comparison with old code. Seeds: 5
(the paper's) on an accelerator, 2 on the CPU unless --seeds says otherwise; epochs of sections 3-6: 2 on an
accelerator, 1 on the CPU unless --epochs; section 6 (every method, ~10 min of a quiet 2-core CPU at 5 seeds) runs
on an accelerator, on the CPU only with --all-methods. So the CPU default measures the same comparisons (batched vs
per-agent loop on the same seeds and epochs, before vs after, 1 vs several seeds) on 2 seeds x 12 agents x 1 epoch
instead of 5 x 12 x 2: 7.4 min at 2 epochs on the shared 2-core machine (load 9-14), the per-agent loop 3.2 min
of it.

Configuration (printed): WALLA I heads Linear(576 -> 4096) -> 512 -> 256 -> 1 (projection_dim 4096, the
reference's parametrization), dropout 0.1, batch 100, lr 5e-5, T 2, clip 1.0, no early stop.
Prints:
    1. measured now: the GEMM peaks (n = 2048 square GEMM, best of repeats) of float32 and bf16, the memory
       bandwidth (a fused Adam step on 64M parameters), and the precision "auto" picks
       (engine.resolve_precision's probe);
    2. before / after of one WALLA training step (forward, loss, backward, per-head clipping, Adam step) of
       `--step-heads` paper-width heads, at the SAME precision: float32 vs float32 and bf16 autocast vs bf16
       autocast. "Before" is the code of commit BEFORE_COMMIT, read from git history into a temporary
       directory (never imported by the package): the hand-written backward (heads._StackedAffine, gradients
       written into persistent buffers) with torch's fused Adam in float32, and in bf16 its master mode with
       mixed_adam.MasterAdam (a C kernel compiled at run time; when it cannot be built, that commit's autocast
       recipe). "After" is the package: StackedHeads on autograd's own backward, engine.make_optimizer
       (torch's fused Adam), engine/clipping.py's per-slice clipping (SliceClip's halves). The ratio printed is the old code's speedup, after
       step time / before step time (> 1: the old code was faster); it goes unless that is >= 1.5 at the
       default precision (32-true). Its reason to exist was the fresh weight gradient autograd allocates
       every step (first touch of new pages); run at the paper's size (--step-heads 60: 12 agents x 5
       seeds) to see it. torch's opt-in transparent huge pages for large CPU allocations
       (THP_MEM_ALLOC_ENABLE=1 in the environment) make that first touch cheaper;
    3. WALLA I batched (all agents x all seeds in one StackedHeads module, walla.fit through Lightning
       Fabric) in float32 and bf16-mixed: wall time of fit, the mean step time (between consecutive
       per-step log calls, first interval skipped), model FLOPs per step (forward, weight gradients,
       activation gradients except the input's), MFU = FLOPs / step time / GEMM peak of the dtype used,
       and the memory floor: the bytes each step must move (Adam's fp32 state, gradient, casts; MIN_BYTES
       per parameter) / measured bandwidth -> the MFU bound it implies;
    4. test Brier and D-regret of the pooled forecast per seed, float32 vs bf16-mixed (mean +- 95% CI over
       seeds, paired difference); bf16 is used only if both stay within the fp32 seed noise;
    5. the reference's per-agent algorithm with the same heads, implemented as the reference does it: one
       nn.Module and one Adam per agent, a Python loop over agents, a no-grad wager pass then an update
       pass with a fresh forward per agent, per-agent clipping (float32; its training loop only is timed,
       against the whole batched fit call);
    6. every registered method x seeds through its module's fit/predict (the path walla-train takes);
       a method that cannot run here is excluded and named with the reason;
    7. where a WALLA fit's time goes (issues 22, 31), with the paper's heads on a store of SHARE_SIZES: with
       --device cuda 12 agents, H = 4096, 902 / 112 / 112 rows, 5 epochs; on the CPU 4 agents, H = 256, 400
       rows, 2 epochs (--agents, --hidden, --rows, --share-epochs set each):
       the wall time of walla.fit for 1 seed and for --seeds seeds (one batched fit where memory allows,
       device_memory.seeds_per_chunk; best of --share-reps) and their ratio, and the same fits with each device
       read waited for at once (`waits_at_once`: the step's two waits before issue 31, same numbers); the floor of one seed's device time
       (model FLOPs at the measured float32 GEMM peak + MIN_BYTES per parameter per step at the measured
       bandwidth) and the ratio it allows: T(S seeds) >= T(1 seed) + (S - 1) x floor, since more seeds add
       only device work; then, for both fits, the share of the fit's wall time spent in device steps
       (forward, backward, clipping, optimizer step) and every other phase (PHASES: stopping summary and
       bookkeeping, best-state copies, dropout masks, batch indices, Fabric, head init, data staging,
       optimizer set-up, the best state; each timed with the device synchronized before and after, so a
       phase's time is the device's, not the launch queue's), and the rest;
    8. with --cli (after 7): the walla-train command itself, a fresh process each, on a temporary store of
       the same shape (homo, `--model bench-llm --dataset bayesx --methods walla-i`, the paper's bayesx
       preset with --share-epochs): the import of the train recipe alone, then for 1 and --seeds seeds the
       command's wall time against what its run.json files give the fits and predictions; the rest is the
       command's own (imports, CUDA and Lightning set-up, store reads, writes).
Last line: RESULT walla_train_mfu=<x> walla_speedup_vs_loop=<x> all_methods_s=<x, nan when skipped>
           old_step_speedup_fp32=<x> old_step_speedup_bf16=<x> device_step_share=<x> seeds_over_1=<x> seeds=<n>
(--only-share: RESULT device_step_share=<x> seeds_over_1=<x> seeds=<n>; the share is the --seeds fit's;
all_methods_s was all_methods_5_seeds_s, the seeds are now their own key)
"""

# ruff: noqa: E402 (the options are read before the imports that load torch)
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

from walla.cli.torch_build import device_argument


def parser() -> argparse.ArgumentParser:
    """The options, built before torch loads: --help and a mistyped flag answer at once (one line, exit 2)."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, usage=argparse.SUPPRESS
    )
    ap.add_argument(
        "--device", default="cpu", type=device_argument, help="cpu | cuda | cuda:N (every section but 2)"
    )
    ap.add_argument(
        "--seeds", type=int, help="seeds of sections 3-8 (default: 5 on an accelerator, 2 on the CPU)"
    )
    ap.add_argument(
        "--epochs", type=int, help="epochs of sections 3-6 (default: 2 on an accelerator, 1 on the CPU)"
    )
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--skip-all", action="store_true", help="no section 6 (every method), on any device")
    ap.add_argument(
        "--all-methods", action="store_true", help="section 6 on the CPU too (default: accelerators)"
    )
    ap.add_argument("--step-heads", type=int, default=12, help="heads of the before/after step (section 2)")
    ap.add_argument(
        "--step-reps", type=int, default=5, help="timed steps per before/after measurement (median)"
    )
    ap.add_argument("--only-step", action="store_true", help="section 2 alone")
    ap.add_argument("--only-share", action="store_true", help="section 7 alone")
    ap.add_argument("--agents", type=int, help="agents of section 7's store (default: SHARE_SIZES)")
    ap.add_argument("--hidden", type=int, help="hidden size H of section 7's store (default: SHARE_SIZES)")
    ap.add_argument("--rows", type=int, help="questions of section 7's store, 8:1:1 (default: SHARE_SIZES)")
    ap.add_argument("--share-epochs", type=int, help="epochs of section 7's fits (default: SHARE_SIZES)")
    ap.add_argument("--share-reps", type=int, default=2, help="section 7: best of this many fits per size")
    ap.add_argument(
        "--cli", action="store_true", help="section 8 too: the walla-train command at section 7's size"
    )
    return ap


if __name__ == "__main__":
    parser().parse_args()

import numpy as np
import polars as pl
import torch
from walla.manifests.validate import build
from walla.store.features import FeatureSetSpec, open_writer
from walla.store.questions import write_question_table
from walla.store.scenario import ScenarioData
from walla.store.schema import VARIANT_CODE
from walla.train import mechanism
from walla.train.engine import (
    TrainEnv,
    free_device_bytes,
    gemm_flops,
    make_optimizer,
    resolve_device,
    resolve_precision,
    scale_slices_,
    seeded,
    slice_clip_coefs,
)
from walla.train.engine import _memory as device_memory
from walla.train.methods import REGISTRY, get_method, walla
from walla.train.wagers import DropoutMasks, StackedHeads, WagerHead, train_heads
from walla.train.wagers import _stopping as online_stop
from walla.train.wagers import _training as wager_training

HEADS = {"lr": 5e-5, "batch_size": 100, "projection_dim": 4096, "hidden": [512, 256], "patience": 10**9}
BEFORE_COMMIT = "2c38e00"  # the last commit with the hand-written backward and mixed_adam.MasterAdam
# bytes per parameter each step must move at least: fused Adam reads p, g, m, v and writes p, m, v (28),
# backward writes the fp32 gradient (4), clipping reads it for the per-head norm (4), the forward reads the
# weight (4). bf16-mixed (autocast): the 32-true bytes + the cast to a bf16 copy (read 4 + write 2) - 2 (the
# GEMMs read bf16) + the bf16 gradient written then converted into the fp32 one (write 2 + read 2).
MIN_BYTES = {"32-true": 40, "bf16-mixed": 50}
# section 7's store and fits when the command line names no size: the paper's (12 agents, H = 4096, 902 / 112 /
# 112 rows, 5 epochs) on an accelerator; on the CPU a size that runs in minutes (the paper's ran past 25 min)
SHARE_SIZES = {
    "accelerator": {"agents": 12, "hidden": 4096, "rows": 1126, "share_epochs": 5},
    "cpu": {"agents": 4, "hidden": 256, "rows": 400, "share_epochs": 2},
}
# seeds of sections 3-8 when --seeds is not given: the paper's 5 on an accelerator; on the CPU 2 (5 seeds' fits,
# loop and section 6 ran past 12 min on the shared 2-core machine; 2 seeds x 12 agents still fill a fit chunk)
DEFAULT_SEEDS = {"accelerator": 5, "cpu": 2}
DEFAULT_EPOCHS = {
    "accelerator": 2,
    "cpu": 1,
}  # sections 3-6 (the per-agent loop: 3.2 min of 2 epochs on the CPU)


# ---------------------------------------------------------------------------- the synthetic scenario


def synthetic_scenario(n: int, m: int, k: int, h: int, seed: int) -> ScenarioData:
    """Private-context questions: per question one random agent holds the evidence (confident and mostly
    right), the others guess; a fixed direction of each agent's hidden space marks whether it holds it,
    so the wager heads have something to learn. Split 8:1:1 at random: val and test int(n / 10) rows each,
    train the rest (n = 1000: 800 / 100 / 100; 1126: 902 / 112 / 112), exactly n rows for any n >= 10."""
    if n < 10:
        raise ValueError(f"synthetic_scenario: n must be >= 10 questions (an 8:1:1 split), got {n}")
    rng = np.random.default_rng(seed)
    n_eval = n // 10
    split = np.array(["train"] * (n - 2 * n_eval) + ["val"] * n_eval + ["test"] * n_eval)
    split = split[rng.permutation(n)]
    informed = rng.integers(0, m, size=n)
    is_inf = np.arange(m)[None, :] == informed[:, None]  # [N, M]
    label = rng.integers(0, k, size=n)
    logits = rng.normal(0.0, 0.7, size=(n, m, k))  # uninformed: unsure guesses
    logits[np.arange(n), informed, label] += rng.uniform(2.5, 4.5, size=n)  # informed: confident, right
    z = np.exp(logits - logits.max(-1, keepdims=True))
    probs = (z / z.sum(-1, keepdims=True)).astype(np.float32)  # [N, M, K]
    hidden = []
    for i in range(m):
        u = rng.normal(size=h)
        u *= 2.0 / np.linalg.norm(u)  # the marker direction
        sign = np.where(is_inf[:, i], 1.0, -1.0)[:, None]
        hidden.append((rng.normal(size=(n, h)) + sign * u).astype(np.float32))  # [N, H]
    question = [f"Synthetic question {j}: which of the {k} options is right?" for j in range(n)]
    prompts = [
        [f"Context: evidence {j}. {q}" if is_inf[j, i] else q for j, q in enumerate(question)]
        for i in range(m)
    ]
    return ScenarioData(
        name="bench-train-speed",
        dataset="synthetic",
        agents=[f"synth{i}" for i in range(m)],
        question_id=np.array([f"q{j:05d}" for j in range(n)]),
        split=split,
        question=question,
        prompts=prompts,
        n_options=np.full(n, k, dtype=np.int64),
        option_mask=np.ones((n, k), dtype=bool),
        probs=probs,
        label=label.astype(np.int64),
        target=np.eye(k, dtype=np.float32)[label],
        soft_target=False,
        prompt_nll=(2.0 - 0.3 * is_inf + rng.normal(0.0, 0.2, size=(n, m))).astype(np.float32),
        variant=np.where(is_inf, VARIANT_CODE["relevant"], VARIANT_CODE["none"]).astype(np.int8),
        hidden=hidden,
        meta={"informed": informed, "seed": seed, "context_rule": "one_relevant"},
    )


# ---------------------------------------------------------------------------- measured machine limits


def step_flops(dims: list[int], b: int) -> float:
    """Model FLOPs of one training step of one head: forward + weight grads + activation grads (not dx)."""
    macs = [a * c for a, c in zip(dims[:-1], dims[1:], strict=True)]
    return 2.0 * b * (2 * sum(macs) + sum(macs[1:]))


def sync(device: str) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously; the CPU needs nothing)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def mem_bandwidth(device: str = "cpu", n: int = 64 * 2**20) -> float:
    """Measured bytes/s that a fused Adam step moves (28 bytes per float32 parameter: reads p, g, m, v,
    writes p, m, v) on n parameters, best of 3: the memory speed the training step's largest pass gets."""
    p = torch.nn.Parameter(torch.zeros(n, device=device))
    p.grad = torch.full_like(p, 1e-3)
    opt = torch.optim.Adam([p], lr=1e-3, fused=True)
    opt.step()
    return 28 * n / min(_timed(opt.step, device) for _ in range(3))


def _timed(fn, device: str = "cpu") -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def gemm_peak(dtype: torch.dtype, device: str) -> float:
    """GEMM peak of `dtype` on `device`: n = 2048 on a CPU, 8192 on a GPU (2048 leaves an H100 idle)."""
    return gemm_flops.__wrapped__(dtype, device, 8192 if torch.device(device).type == "cuda" else 2048)


def roofline(n_params: int, flops: float, peak: float, bw: float, bytes_per_param: int) -> float:
    """Upper bound of MFU when each step must move `bytes_per_param` per parameter through memory (not
    overlapped with the GEMMs: Adam, clipping and casts are separate passes after / before them)."""
    t_mem = n_params * bytes_per_param / bw
    return flops / (t_mem + flops / peak) / peak


# ---------------------------------------------------------------------------- 2. before / after of one step


def load_before(commit: str = BEFORE_COMMIT) -> tuple[ModuleType, ModuleType] | str:
    """train/wagers/_heads.py and train/mixed_adam.py of `commit` from git history, imported from a temporary
    directory as standalone modules (their one package import re-pointed); or why they cannot be."""
    root = Path(__file__).resolve().parents[1]
    sources = {}
    for name in ("heads", "mixed_adam"):
        try:
            out = subprocess.run(
                ["git", "-C", str(root), "show", f"{commit}:train/{name}.py"],
                check=True,
                capture_output=True,
                text=True,
            )
        except (OSError, subprocess.CalledProcessError) as e:
            return f"git show {commit}:train/{name}.py failed ({type(e).__name__})"
        sources[name] = out.stdout
    sources["heads"] = sources["heads"].replace(
        "from walla.train.mixed_adam import", "from walla_before_mixed_adam import"
    )
    tmp = Path(tempfile.mkdtemp(prefix="walla-before-"))
    modules = []
    for name in ("mixed_adam", "heads"):  # heads imports mixed_adam (lazily, in master mode)
        path = tmp / f"walla_before_{name}.py"
        path.write_text(sources[name])
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        spec.loader.exec_module(module)
        modules.append(module)
    mixed_adam, heads = modules
    return heads, mixed_adam


def _step_data(g: int, h: int, cfg: walla.Config) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
    """One batch for G heads: x [G, b, H], dropout keep-masks, regression targets [G, b]."""
    gen = torch.Generator().manual_seed(0)
    b = cfg.batch_size
    x = torch.randn(g, b, h, generator=gen)
    masks = [(torch.rand(g, b, w, generator=gen) >= cfg.dropout).float() for w in cfg.hidden]
    return x, masks, torch.rand(g, b, generator=gen, dtype=torch.float64)


def _wager_loss(r: torch.Tensor, goal: torch.Tensor, cfg: walla.Config) -> torch.Tensor:
    return ((torch.sigmoid(r.double() / cfg.temperature) - goal) ** 2).mean(1).sum()


def _after_step(g: int, h: int, cfg: walla.Config, bf16: bool) -> Callable[[], None]:
    """The package's step: autograd backward, engine optimizer, engine/clipping.py's per-slice clipping."""
    with seeded(0):
        heads = StackedHeads([h] * g, cfg.hidden, cfg.dropout, cfg.projection_dim)
    opt = make_optimizer(heads.parameters(), "adam", cfg.lr)
    x, masks, goal = _step_data(g, h, cfg)
    params = list(heads.parameters())

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            r = heads(x, masks)
        _wager_loss(r, goal, cfg).backward()
        _, coef = slice_clip_coefs(params, cfg.clip)  # SliceClip's math, without Fabric's unscale
        if bool((coef < 1.0).any()):
            scale_slices_(params, coef)
        opt.step()

    return step


def _before_step(old_heads: ModuleType, old_adam: ModuleType, g: int, h: int, cfg, bf16: bool):
    """Commit BEFORE_COMMIT's step: write_grads backward; float32: torch's fused Adam; bf16: MasterAdam
    (its master mode) where its kernel builds, else that commit's autocast recipe with fused Adam."""
    with seeded(0):
        heads = old_heads.StackedHeads([h] * g, cfg.hidden, cfg.dropout, cfg.projection_dim)
    master = bf16 and not old_adam.unavailable("bf16-mixed", torch.device("cpu"))
    if master:
        opt = old_adam.MasterAdam(heads, cfg.lr)
    else:
        opt = torch.optim.Adam(heads.parameters(), lr=cfg.lr, fused=True)
    x, masks, goal = _step_data(g, h, cfg)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            r = heads(x, masks, write_grads=True)
        _wager_loss(r, goal, cfg).backward()
        heads.clip_per_head_(cfg.clip)
        opt.step()

    if master:
        return step, "hand-written backward, bf16 gradients, MasterAdam"
    return step, "hand-written backward" + (" under autocast" if bf16 else "") + ", fused Adam"


def gradient_gap(old_heads: ModuleType, g: int, h: int, cfg: walla.Config) -> float:
    """Max abs difference between the old hand-written backward's gradients and autograd's on one float32
    batch (same init, data and masks): 0 when the new path computes the same numbers."""
    grads = []
    for module in (old_heads, None):
        with seeded(0):
            if module is None:
                heads = StackedHeads([h] * g, cfg.hidden, cfg.dropout, cfg.projection_dim)
            else:
                heads = module.StackedHeads([h] * g, cfg.hidden, cfg.dropout, cfg.projection_dim)
        x, masks, goal = _step_data(g, h, cfg)
        r = heads(x, masks) if module is None else heads(x, masks, write_grads=True)
        _wager_loss(r, goal, cfg).backward()
        grads.append([p.grad.clone() for p in heads.parameters()])
    return max(float((a - b).abs().max()) for a, b in zip(*grads, strict=True))


def _step_seconds(step: Callable[[], None], reps: int) -> float:
    """Median seconds of `reps` steps after two warm-up steps."""
    for _ in range(2):
        step()
    return float(np.median([_timed(step) for _ in range(reps)]))


def before_after(g: int, cfg: walla.Config, reps: int, h: int = 576) -> dict[str, float]:
    """Section 2: per-step seconds before and after, float32 and bf16; the old code's speedups
    (after / before)."""
    print(f"one WALLA step of {g} heads {[h, cfg.projection_dim, *cfg.hidden, 1]}, batch {cfg.batch_size}:")
    old = load_before()
    if isinstance(old, str):
        print(f"  before ({BEFORE_COMMIT}) unavailable: {old}; after only")
    else:
        gap = gradient_gap(old[0], g, h, cfg)
        print(f"  float32 gradients of one batch, before vs after: max abs difference {gap:.3g}")
    ratios = {}
    for label, bf16 in (("fp32", False), ("bf16", True)):
        after = _step_seconds(_after_step(g, h, cfg, bf16), reps)
        if isinstance(old, str):
            print(f"  {label}: after {after:.3f} s/step")
            ratios[label] = math.nan
            continue
        step, how = _before_step(*old, g, h, cfg, bf16)
        before = _step_seconds(step, reps)
        ratios[label] = after / before
        print(
            f"  {label}: before {before:.3f} s/step ({how}), after {after:.3f} s/step (autograd, torch fused "
            f"Adam): old code's speedup {ratios[label]:.2f}"
        )
    return ratios


# ---------------------------------------------------------------------------- 3-6. fits


def per_agent_loop(data, cfg: walla.Config, seed: int, device: str = "cpu") -> float:
    """The reference's training loop for one seed (no early stopping): returns wall seconds."""
    train = data.split_index("train")
    x = [torch.from_numpy(np.asarray(h[train], dtype=np.float32)).to(device) for h in data.hidden]  # [n, H]
    probs = torch.from_numpy(np.asarray(data.probs[train], dtype=np.float64)).to(device)  # [n, M, K]
    target = torch.from_numpy(np.asarray(data.target[train], dtype=np.float64)).to(device)  # [n, K]
    with seeded(seed):
        heads = [WagerHead(h.shape[1], cfg.hidden, cfg.dropout, cfg.projection_dim, device=device) for h in x]
    opts = [torch.optim.Adam(h.parameters(), lr=cfg.lr) for h in heads]
    order = np.random.default_rng(seed).permutation(len(train))
    sync(device)
    t0 = time.perf_counter()
    with seeded(seed, device):
        for _epoch in range(cfg.epochs):
            for start in range(0, len(order), cfg.batch_size):
                rows = torch.from_numpy(order[start : start + cfg.batch_size]).to(device)
                _reference_batch(heads, opts, [xi[rows] for xi in x], probs[rows], target[rows], cfg)
    sync(device)
    return time.perf_counter() - t0


def _reference_batch(heads, opts, xs, p, y, cfg: walla.Config) -> None:
    """One batch of the reference: a no-grad wager pass (metric), then per agent a forward and update."""
    for h in heads:
        h.train()
    with torch.no_grad():  # compute_wagers (train mode) -> aggregate -> batch metric
        w = torch.stack([torch.sigmoid(h(xi) / cfg.temperature) for h, xi in zip(heads, xs, strict=True)], 1)
        float(mechanism.brier_regret(mechanism.pool(p, w.double(), validate=False), p, y).mean())
    w_new = [torch.sigmoid(h(xi).double() / cfg.temperature) for h, xi in zip(heads, xs, strict=True)]
    with torch.no_grad():
        wd = torch.stack([wi.detach() for wi in w_new], 1)
        adv = mechanism.advantage(p, wd, y, cfg.variant, validate=False)
        w_star = mechanism.best_response_wager(adv, cfg.c3, w_max=1.0)
    for i, (h, opt) in enumerate(zip(heads, opts, strict=True)):
        loss = ((w_new[i] - w_star[:, i]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(h.parameters(), cfg.clip)
        opt.step()


def batched(data, cfg: walla.Config, seeds: list[int], precision: str, device: str = "cpu") -> dict:
    """WALLA I's batched trainer through fit (all seeds in one module) + test predictions per seed.

    Returns wall seconds of fit, the per-step durations (between consecutive per-step log calls, which
    happen at the same point of every step) and per-seed test Brier / D-regret of the pooled forecast."""
    env, stamps = TrainEnv(device=device, precision=precision), []
    logs = [lambda _row: stamps.append(time.perf_counter())] + [None] * (len(seeds) - 1)
    sync(device)
    t0 = time.perf_counter()
    states = walla.fit(data, cfg, seeds, env, logs)
    sync(device)
    secs = time.perf_counter() - t0
    test = data.split_index("test")
    p, y = (torch.from_numpy(np.asarray(a[test], dtype=np.float64)) for a in (data.probs, data.target))
    brier, regret = [], []
    for st in states:
        agg = torch.from_numpy(walla.predict(st, data, test, env).agg_probs)
        brier.append(float(mechanism.brier_loss(agg, y).mean()))
        regret.append(float(mechanism.brier_regret(agg, p, y).mean()))
    steps = [b - a for a, b in zip(stamps[:-1], stamps[1:], strict=True)]
    return {"secs": secs, "steps": steps, "brier": np.array(brier), "regret": np.array(regret)}


def ci95(x: np.ndarray) -> float:
    """Half-width of a 95% t interval of the mean (n <= 10 seeds)."""
    t = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 7: 2.45, 8: 2.36, 9: 2.31, 10: 2.26}.get(len(x), 1.96)
    return float(t * x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else math.nan


def same_within_noise(ref: dict, other: dict) -> bool:
    """Test Brier and D-regret: |mean paired difference| <= the 95% CI half-width of the fp32 seed mean."""
    ok = True
    for key in ("brier", "regret"):
        d = other[key] - ref[key]
        ok &= bool(abs(d.mean()) <= ci95(ref[key]))
        print(
            f"  test {key:<6} 32-true {ref[key].mean():.5f} +- {ci95(ref[key]):.5f}   bf16-mixed "
            f"{other[key].mean():.5f} +- {ci95(other[key]):.5f}   paired diff {d.mean():+.6f} +- {ci95(d):.6f}"
        )
    return ok


def all_methods(data, seeds: list[int], epochs: int, device: str = "cpu") -> float:
    total, excluded = 0.0, []
    for name, info in REGISTRY.items():
        try:
            _, mod = get_method(name)
            raw = dict(info.defaults)
            if info.path.endswith(".walla"):
                raw.update({**HEADS, "epochs": epochs, "patience": 1500})
            cfg = build(mod.Config, raw, name)
            cfg = mod.resolve(cfg, data) if hasattr(mod, "resolve") else cfg
            sync(device)
            t0 = time.perf_counter()
            env = TrainEnv(device=device)
            states = mod.fit(data, cfg, seeds, env, [None] * len(seeds))
            for st in states:
                mod.predict(st, data, data.split_index("test"), env)
            sync(device)
            dt = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 - report and go on
            excluded.append(f"{name} ({type(e).__name__}: {' '.join(str(e).split())[:120]})")
            continue
        total += dt
        print(f"  {name:<16} {dt:7.2f} s  ({len(seeds)} seeds)")
    if excluded:
        print("excluded: " + "; ".join(excluded))
    print(f"all {len(REGISTRY) - len(excluded)} methods x {len(seeds)} seeds: {total:.2f} s")
    return total


def fits_by_precision(
    data, cfg, seeds, peak: dict, bw: float, dims: list[int], device: str
) -> tuple[dict, list]:
    """Section 3: the batched fit at 32-true and bf16-mixed, with step times, MFU and the memory floor."""
    flops = step_flops(dims, cfg.batch_size) * data.n_agents * len(seeds)  # one full-batch step, all heads
    n_params = sum(a * c + c for a, c in zip(dims[:-1], dims[1:], strict=True)) * data.n_agents * len(seeds)
    print(
        f"one step, all {data.n_agents * len(seeds)} heads: {flops / 1e9:.1f} GFLOP, {n_params / 1e6:.0f}M "
        f"parameters ({n_params * 4 / 2**30:.2f} GiB float32)"
    )
    chunks = list(walla._seed_chunks(data, cfg, seeds, TrainEnv(device=device)))  # fit's seed chunks (memory)
    c_flops, c_params = (v * len(chunks[0]) / len(seeds) for v in (flops, n_params))  # first chunk's heads
    print(
        f"fit trains the seeds in chunks of {[len(c) for c in chunks]} ({budget_text(device)}); step times "
        f"and MFU below are the first chunk's ({len(chunks[0]) * data.n_agents} heads, {c_flops / 1e9:.1f} "
        "GFLOP per step)"
    )
    runs = {}
    for prec in dict.fromkeys(["32-true", "bf16-mixed" if peak["bf16-mixed"] > 0 else "32-true"]):
        dtype = torch.bfloat16 if prec == "bf16-mixed" else torch.float32
        local = gemm_peak(dtype, device)  # re-measured next to the run (shared machine)
        r = runs[prec] = batched(data, cfg, seeds, prec, device)
        peak[prec] = max(peak[prec], local)  # MFU against the best peak seen in this run (conservative)
        full = r["steps"][1:]  # every batch is full (800 train rows); the first interval warms up
        r["step_s"] = float(np.mean(full))
        r["mfu"] = c_flops / r["step_s"] / peak[prec]
        floor_gb = c_params * MIN_BYTES[prec] / 1e9
        bound = roofline(c_params, c_flops, peak[prec], bw, MIN_BYTES[prec])
        print(
            f"  batched WALLA I, {prec:<10}: fit {r['secs']:6.2f} s, step {r['step_s']:.3f} s (mean of "
            f"{len(full)} steps) = {c_flops / r['step_s'] / 1e9:.1f} GFLOP/s, MFU {r['mfu']:.3f} of the "
            f"{prec} GEMM peak; memory floor {floor_gb:.1f} GB/step = {floor_gb * 1e9 / bw:.3f} s -> "
            f"MFU bound {bound:.3f}"
        )
    return runs, chunks


def loop_comparison(
    data, cfg, seeds, runs: dict, chunks: list, precision: str, peak, bw, dims, device
) -> float:
    """Section 5: the reference's per-agent loop against the batched fit; returns the loop's seconds."""
    flops = step_flops(dims, cfg.batch_size) * data.n_agents * len(seeds)
    n_params = sum(a * c + c for a, c in zip(dims[:-1], dims[1:], strict=True)) * data.n_agents * len(seeds)
    t_loop = sum(per_agent_loop(data, cfg, s, device) for s in seeds)
    secs, n_steps = runs[precision]["secs"], len(runs[precision]["steps"]) + 1
    fwd = 2.0 * cfg.batch_size * sum(a * c for a, c in zip(dims[:-1], dims[1:], strict=True))  # its 2nd pass
    loop_flops = (flops + fwd * data.n_agents * len(seeds)) * n_steps
    floor = n_steps * (n_params * MIN_BYTES[precision] / bw + flops / peak[precision])
    steps_alone = runs[precision]["step_s"] * n_steps * len(seeds) / len(chunks[0])
    print(
        f"  per-agent loop (reference algorithm, float32, training loop only): {t_loop:7.2f} s = "
        f"{loop_flops / t_loop / 1e9:.1f} GFLOP/s ({loop_flops / t_loop / peak['32-true']:.2f} of the fp32 "
        f"peak; it runs a second forward pass); batched fit ({precision}, init + Fabric + steps + best "
        f"state): {secs:.2f} s, its steps alone ~{steps_alone:.2f} s"
        f"\n  speedup bound: loop time / (steps x (memory floor + GEMMs at peak)) = {t_loop / floor:.2f}"
    )
    return t_loop


# ---------------------------------------------------------------------------- 7. device steps' share


def budget_text(device: str) -> str:
    """What sizes the seed chunks on `device` (device_memory.seeds_per_chunk)."""
    free = free_device_bytes(device)
    if free is None:
        return (
            f"host budget device_memory.PARAM_BUDGET_BYTES {device_memory.PARAM_BUDGET_BYTES / 2**30:.0f} GiB"
        )
    return f"{device_memory.DEVICE_MEMORY_SHARE:.0%} of the {free / 2**30:.1f} GiB free on {device}"


# where a WALLA fit's time goes: (owner, attribute, label) of every function PhaseTimer times
PHASES = [
    (wager_training._WagerTraining, "forward", "device step: forward (heads, wagers, loss)"),
    (wager_training._WagerTraining, "backward", "device step: backward + per-head norms"),
    (wager_training._WagerTraining, "update", "device step: clipping + Adam (reads the clip flag)"),
    (wager_training._WagerTraining, "summary", "stopping summary (device, small kernels)"),
    (wager_training._WagerTraining, "account", "stopping bookkeeping (host; reads the summary)"),
    (online_stop.OnlineStop, "_copy_rows", "best-state copies (device)"),
    (DropoutMasks, "take", "dropout masks (wait for the host draw + copy)"),
    (wager_training, "to_device", "batch indices to the device"),
    (wager_training, "make_fabric", "Fabric"),
    (wager_training, "init_heads", "head init (drawn on the device)"),
    (wager_training, "_train_rows", "training rows to the device (gather + copy)"),
    (wager_training._WagerTraining, "__init__", "optimizer + fabric.setup"),
    (online_stop.OnlineStop, "best_or_last", "best state handed back"),
]
STEP_PHASES = ("forward", "backward", "update")  # the device steps of the share


class PhaseTimer:
    """Seconds of each PHASES function during a WALLA fit, the device synchronized before and after each
    call (so a phase's time is the device's, not the launch queue's); a phase called inside another (a best
    copy inside the bookkeeping) counts for itself only."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.seconds = {attr: 0.0 for _, attr, _ in PHASES}
        self.stack: list[str] = []

    @property
    def steps(self) -> float:
        """Seconds in device steps: forward, backward, clipping and the optimizer step."""
        return sum(self.seconds[a] for a in STEP_PHASES)

    def _timed(self, fn, attr: str):
        def run(*args, **kwargs):
            sync(self.device)
            t0 = time.perf_counter()
            self.stack.append(attr)
            try:
                return fn(*args, **kwargs)
            finally:
                sync(self.device)
                dt = time.perf_counter() - t0
                self.stack.pop()
                self.seconds[attr] += dt
                if self.stack:
                    self.seconds[self.stack[-1]] -= dt

        return run

    @contextmanager
    def patched(self) -> Iterator[PhaseTimer]:
        saved = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in PHASES]
        for owner, attr, fn in saved:
            setattr(owner, attr, self._timed(fn, attr))
        try:
            yield self
        finally:
            for owner, attr, fn in saved:
                setattr(owner, attr, fn)


def timed_fit(
    data, cfg: walla.Config, seeds: list[int], env: TrainEnv, timer: PhaseTimer | None = None
) -> float:
    """Wall seconds of walla.fit (device synchronized at both ends); with `timer`, its phases timed."""
    sync(env.device)
    t0 = time.perf_counter()
    if timer is None:
        walla.fit(data, cfg, seeds, env, [None] * len(seeds))
    else:
        with timer.patched():
            walla.fit(data, cfg, seeds, env, [None] * len(seeds))
    sync(env.device)
    return time.perf_counter() - t0


def step_floor(data, cfg: walla.Config, device: str) -> tuple[float, float, float, int]:
    """The least device time one seed's steps can take: (seconds, GFLOP, GB, steps). Per step the model
    FLOPs at the measured float32 GEMM peak plus MIN_BYTES per parameter at the measured bandwidth."""
    train = len(data.split_index("train"))
    dims = [max(int(h.shape[1]) for h in data.hidden), cfg.projection_dim, *cfg.hidden, 1]
    dims = [d for d in dims if d]
    sizes = [min(cfg.batch_size, train - t) for t in range(0, train, cfg.batch_size)] * cfg.epochs
    flops = sum(step_flops(dims, b) for b in sizes) * data.n_agents
    n_params = sum(a * c + c for a, c in zip(dims[:-1], dims[1:], strict=True)) * data.n_agents
    peak = gemm_peak(torch.float32, device)
    bw = mem_bandwidth(device, max(2**20, min(64 * 2**20, n_params)))
    moved = n_params * MIN_BYTES["32-true"] * len(sizes)
    return flops / peak + moved / bw, flops / 1e9, moved / 1e9, len(sizes)


def print_phases(timer: PhaseTimer, wall: float) -> None:
    """One line per phase (seconds, share of the fit's wall), then the rest."""
    labels = {attr: label for _, attr, label in PHASES}
    for attr, sec in sorted(timer.seconds.items(), key=lambda kv: -kv[1]):
        print(f"    {labels[attr]:<54} {sec:7.3f} s {sec / wall:6.1%}")
    rest = wall - sum(timer.seconds.values())
    print(
        f"    {'other (fit set-up, seed chunks, states, Python between)':<54} {rest:7.3f} s {rest / wall:6.1%}"
    )


@contextmanager
def waits_at_once() -> Iterator[None]:
    """Nearly the step before issue 31: each device read waited for where it is queued (the stopping summary
    right after the forward pass, before the backward is queued; the clip flag right after the norms), so
    the device's queue drains twice per step (that step also did the stopping bookkeeping before queueing
    the backward: a little more idle time than this). Same numbers; only when the host waits changes."""
    cls = wager_training._WagerTraining
    summary, backward = cls.summary, cls.backward

    def summary_now(self, *args, **kwargs):
        read = summary(self, *args, **kwargs)
        read.result()
        return read

    def backward_now(self, *args, **kwargs):
        clip, flag = backward(self, *args, **kwargs)
        flag.result()
        return clip, flag

    cls.summary, cls.backward = summary_now, backward_now
    try:
        yield
    finally:
        cls.summary, cls.backward = summary, backward


def device_share(args, device: str, precision: str) -> tuple[float, float]:
    """Section 7: fit time of 1 seed vs --seeds seeds, the floor of a seed's device time, and where each
    fit's time goes (phases, the device synchronized around each)."""
    data = synthetic_scenario(n=args.rows, m=args.agents, k=2, h=args.hidden, seed=1)
    cfg = walla.resolve(build(walla.Config, {**HEADS, "epochs": args.share_epochs}, "bench"), data)
    seeds, env = [18 + r for r in range(args.seeds)], TrainEnv(device=device, precision=precision)
    train, val = len(data.split_index("train")), len(data.split_index("val"))
    print(
        f"7. WALLA I fit on {device} ({precision}): M={args.agents} H={args.hidden} N={args.rows} ({train} "
        f"train / {val} val), {cfg.epochs} epochs, batch {cfg.batch_size}, projection {cfg.projection_dim}; "
        f"seed chunks {[len(c) for c in walla._seed_chunks(data, cfg, seeds, env)]} ({budget_text(device)})"
    )
    warm = build(walla.Config, {**HEADS, "epochs": 1}, "warm-up")
    timed_fit(data, walla.resolve(warm, data), seeds[:1], env)  # Fabric import, kernels, allocator
    reps = max(1, args.share_reps)
    one = min(timed_fit(data, cfg, seeds[:1], env) for _ in range(reps))
    many = min(timed_fit(data, cfg, seeds, env) for _ in range(reps))
    print(
        f"  fit wall (walla.fit, best of {reps}): 1 seed {one:.2f} s, {len(seeds)} seeds {many:.2f} s: "
        f"ratio {many / one:.2f} (goal < 2)"
    )
    floor, gflop, gb, n_steps = step_floor(data, cfg, device)
    bound = (one + (len(seeds) - 1) * floor) / one
    print(
        f"  floor of one seed's device steps: {n_steps} steps, {gflop:.0f} GFLOP at the measured fp32 GEMM peak "
        f"+ {gb:.1f} GB moved at the measured bandwidth = {floor:.2f} s; every other second of the 1-seed fit "
        f"kept, {len(seeds)} seeds take >= {bound:.2f}x one seed (more seeds add only device work)"
    )
    steps = cfg.epochs * math.ceil(train / cfg.batch_size)
    for n in (1, len(seeds)):
        before, after = mask_draws(args.agents, n, cfg, device)
        print(
            f"  dropout masks of {n} seed(s), host time per step: formula {before * 1e3:.1f} ms, "
            f"DropoutMasks {after * 1e3:.1f} ms ({before / after:.2f}x; x {steps} steps = {after * steps:.2f} s "
            "a fit, drawn while the device computes)"
        )
    with waits_at_once():
        old1 = min(timed_fit(data, cfg, seeds[:1], env) for _ in range(reps))
        old_n = min(timed_fit(data, cfg, seeds, env) for _ in range(reps))
    print(
        f"  the same fits with each read waited for at once (two drained queues per step, before issue 31): "
        f"1 seed {old1:.2f} s, {len(seeds)} seeds {old_n:.2f} s; now / then {one / old1:.2f} and "
        f"{many / old_n:.2f}"
    )
    shares = []
    for n in (1, len(seeds)):
        timer = PhaseTimer(device)
        wall = timed_fit(data, cfg, seeds[:n], env, timer)
        shares.append(timer.steps / wall)
        print(
            f"  {n} seed(s), phases timed (the device synchronized around each): device steps "
            f"{timer.steps:.2f} s of the fit's {wall:.2f} s = {shares[-1]:.3f} (goal >= 0.60)"
        )
        print_phases(timer, wall)
    return shares[-1], many / one


# ---------------------------------------------------------------------------- 8. the walla-train command

CLI_MODEL = "bench-llm"  # no models.yaml name: walla-train reads its hidden size from the feature sets


def write_cli_store(store: Path, data: ScenarioData) -> None:
    """A store that `walla-train --scenario homo --model bench-llm --dataset bayesx` assembles: the bayesx
    question table (soft targets) and two feature sets (variants none / relevant) of `data`'s shape, agent
    0's probabilities and hidden states without the context, agent 1's with it."""
    n = len(data.split)
    p = data.probs.astype(np.float64)
    gold = np.clip(data.target[:, 0].astype(np.float64) * 0.9 + 0.05, 0.0, 1.0)
    questions = pl.DataFrame(
        {
            "question_id": list(data.question_id),
            "split": list(data.split),
            "question": list(data.question),
            "options": [["1", "0"]] * n,
            "option_labels": [["1", "0"]] * n,
            "label": data.label,
            "gold_dist": [[g, 1.0 - g] for g in gold],
            "context": [f"evidence {j}" for j in range(n)],
            "subject": pl.Series([None] * n, dtype=pl.String),
        }
    )
    qfp = write_question_table(store, "bayesx", questions, {"benchmark": "train_speed"})
    for agent, variant in ((0, "none"), (1, "relevant")):
        lp = np.log(np.clip(p[:, agent], 1e-12, 1.0))
        lp -= np.logaddexp.reduce(lp, axis=1, keepdims=True)
        rows = pl.DataFrame(
            {
                "question_id": list(data.question_id),
                "n_options": np.full(n, 2, np.int32),
                "option_logprobs": lp.astype(np.float32).tolist(),
                "raw_option_logprobs": (lp - 1.0).astype(np.float32).tolist(),
                "prompt_nll": data.prompt_nll[:, agent],
                "n_prompt_tokens": np.full(n, 100, np.int32),
                "context_source_id": pl.Series([None] * n, dtype=pl.String),
            },
            schema_overrides={
                "option_logprobs": pl.List(pl.Float32),
                "raw_option_logprobs": pl.List(pl.Float32),
            },
        )
        hidden = np.asarray(data.hidden[agent], dtype=np.float16)  # [N, H], the store's dtype
        spec = FeatureSetSpec(CLI_MODEL, "bayesx", variant, {"questions_fp": qfp, "benchmark": "train_speed"})
        with open_writer(store, spec, hidden_size=hidden.shape[1], total_rows=n) as w:
            w.write_shard(rows, hidden)
            w.commit()


def cli_args(store: Path, runs: Path, agents: int, seeds: int, device: str, epochs: int) -> list[str]:
    """walla-train's arguments for section 8 (section 7's epochs, no early stop)."""
    return [
        *("--scenario", "homo", "--model", CLI_MODEL, "--agents", str(agents), "--dataset", "bayesx"),
        *("--methods", "walla-i", "--seeds", str(seeds), "--device", device),
        *("--store", str(store), "--runs", str(runs), "--set", "walla.patience=1000000000"),
        *("--set", f"walla.epochs={epochs}"),
    ]


def cli_wall(
    store: Path, runs: Path, agents: int, seeds: int, device: str, epochs: int
) -> tuple[float, float]:
    """(wall seconds of one `walla-train` process, the seconds its run.json files give the fits and
    predictions: per run the fit's share plus that seed's predict)."""
    args = cli_args(store, runs, agents, seeds, device, epochs)
    cmd = [sys.executable, "-c", "from walla.cli.main import walla_train; walla_train()", *args]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"walla-train failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    metas = [json.loads(f.read_text()) for f in runs.rglob("run.json")]
    return wall, sum(m["wall_time_s"] for m in metas)


def import_wall() -> tuple[float, list[str]]:
    """Wall seconds of a process that only imports the train recipe (torch, Lightning Fabric, the store),
    and which of torchmetrics / transformers it imported (Fabric imports torchmetrics where installed)."""
    code = "import sys, walla.train.run; print(*(m for m in ('torchmetrics', 'transformers') if m in sys.modules))"
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return time.perf_counter() - t0, done.stdout.split()


def cli_section(args, device: str) -> None:
    """Section 8: the walla-train command's wall time against the time its fits and predictions take."""
    data = synthetic_scenario(n=args.rows, m=2, k=2, h=args.hidden, seed=1)
    with tempfile.TemporaryDirectory(prefix="walla-train-speed-") as tmp:
        store = Path(tmp, "store")
        write_cli_store(store, data)
        print(
            f"8. walla-train --scenario homo --model {CLI_MODEL} --agents {args.agents} --dataset bayesx "
            f"--methods walla-i --device {device} --set walla.epochs={args.share_epochs} (paper bayesx preset, "
            "projection 4096), "
            f"H={args.hidden} N={args.rows}; a fresh process each:"
        )
        imports, heavy = import_wall()
        said = ", ".join(f"{m} {'yes' if m in heavy else 'no'}" for m in ("torchmetrics", "transformers"))
        print(f"  python -c 'import walla.train.run': {imports:.2f} s; imported: {said}")
        for n in (1, args.seeds):
            wall, fits = cli_wall(store, Path(tmp, f"runs-{n}"), args.agents, n, device, args.share_epochs)
            print(
                f"  {n} seed(s): command {wall:.2f} s, of which fits + predictions (run.json wall_time_s) "
                f"{fits:.2f} s ({fits / wall:.0%}); outside them {wall - fits:.2f} s"
            )


def mask_draws(agents: int, seeds: int, cfg: walla.Config, device: str, reps: int = 5) -> tuple[float, float]:
    """Host seconds per step to draw one step's dropout masks of `seeds` x `agents` heads: the formula
    drawn one generator after another (the code before issue 31) vs train/wagers/_dropout.py (raw stream, a
    thread per generator; `take` also overlaps it with the device step, which this does not count)."""
    b, keep = cfg.batch_size, 1 - cfg.dropout
    gens = [np.random.default_rng([18 + s, 1]) for s in range(seeds)]

    def formula() -> None:
        for w in cfg.hidden:
            np.concatenate([g.random((agents, b, w), dtype=np.float32) < keep for g in gens])

    rows = [slice(s * agents, (s + 1) * agents) for s in range(seeds)]
    masks = DropoutMasks(gens, rows, cfg.hidden, keep, "cpu")
    try:
        times = [min(_timed(fn) for _ in range(reps)) for fn in (formula, lambda: masks.take(b, None))]
    finally:
        masks.close()
    return times[0], times[1]


def share_precision(requested: str, device: str) -> str:
    """Section 7's precision: 32-true unless one is named (issue 22 measured bf16-mixed: no gain)."""
    return "32-true" if requested == "auto" else resolve_precision(requested, device)


def full_run(args, device: str) -> None:
    """Sections 1-7."""
    cfg = build(walla.Config, {**HEADS, "epochs": args.epochs}, "bench")
    seeds = [18 + r for r in range(args.seeds)]
    data = synthetic_scenario(n=1000, m=12, k=2, h=576, seed=0)
    cfg = walla.resolve(cfg, data)
    peak = {"32-true": gemm_peak(torch.float32, device), "bf16-mixed": gemm_peak(torch.bfloat16, device)}
    bw = mem_bandwidth(device)
    precision = resolve_precision(args.precision, device)
    print(
        f"synthetic scenario N=1000 (8:1:1) M=12 H=576 K=2; {len(seeds)} seeds x {cfg.epochs} epochs on "
        f"{device}; torch threads {torch.get_num_threads()}\nWALLA I heads: projection_dim "
        f"{cfg.projection_dim}, hidden {list(cfg.hidden)}, dropout {cfg.dropout}, batch {cfg.batch_size}, lr "
        f"{cfg.lr}, T {cfg.temperature}"
    )
    print(
        f"measured: GEMM peak float32 {peak['32-true'] / 1e9:.1f} GFLOP/s, bf16 {peak['bf16-mixed'] / 1e9:.1f} "
        f"GFLOP/s; memory bandwidth (fused Adam step) {bw / 1e9:.1f} GB/s"
    )
    print(f"precision: {precision} (requested {args.precision}; engine.resolve_precision's GEMM probe)")
    if torch.device(device).type == "cpu":
        ratios = before_after(args.step_heads, cfg, args.step_reps)
    else:
        print("section 2 (before/after against commit 2c38e00's CPU code) skipped: a CPU comparison")
        ratios = {"fp32": math.nan, "bf16": math.nan}
    warm = walla.resolve(build(walla.Config, {**HEADS, "epochs": 1}, "w"), data)
    train_heads(data, warm, seeds[:1], TrainEnv(device=device))
    dims = [576, cfg.projection_dim, *cfg.hidden, 1]
    runs, chunks = fits_by_precision(data, cfg, seeds, peak, bw, dims, device)
    if "bf16-mixed" in runs and precision == "bf16-mixed":
        if not same_within_noise(runs["32-true"], runs["bf16-mixed"]):
            print("bf16-mixed results are NOT within seed noise of float32: keeping 32-true")
            precision = "32-true"
        else:
            print("bf16-mixed results are within seed noise of float32")
    t_loop = loop_comparison(data, cfg, seeds, runs, chunks, precision, peak, bw, dims, device)
    if args.skip_all or (torch.device(device).type == "cpu" and not args.all_methods):
        print(
            "section 6 (every method) skipped: "
            + ("--skip-all" if args.skip_all else "on the CPU without --all-methods")
        )
        total = math.nan
    else:
        total = all_methods(data, seeds, args.epochs, device)
    share, ratio = device_share(args, device, share_precision(args.precision, device))
    if args.cli:
        cli_section(args, device)
    print(
        f"RESULT walla_train_mfu={runs[precision]['mfu']:.3f} walla_speedup_vs_loop="
        f"{t_loop / runs[precision]['secs']:.2f} all_methods_s={total:.2f} "
        f"old_step_speedup_fp32={ratios['fp32']:.2f} old_step_speedup_bf16={ratios['bf16']:.2f} "
        f"device_step_share={share:.3f} seeds_over_1={ratio:.2f} seeds={args.seeds}"
    )


def share_sizes(args: argparse.Namespace, device: str) -> argparse.Namespace:
    """`args` with the seeds, epochs and section 7's sizes the command line left out taken from DEFAULT_SEEDS,
    DEFAULT_EPOCHS and SHARE_SIZES for `device`'s kind."""
    kind = "cpu" if device == "cpu" else "accelerator"
    sizes = {**SHARE_SIZES[kind], "seeds": DEFAULT_SEEDS[kind], "epochs": DEFAULT_EPOCHS[kind]}
    return argparse.Namespace(
        **{**vars(args), **{k: v for k, v in sizes.items() if getattr(args, k) is None}}
    )


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    device = resolve_device(args.device)
    args = share_sizes(args, device)
    if args.only_step:
        cfg = build(walla.Config, {**HEADS, "epochs": args.epochs}, "bench")
        ratios = before_after(args.step_heads, cfg, args.step_reps)
        print(f"RESULT old_step_speedup_fp32={ratios['fp32']:.2f} old_step_speedup_bf16={ratios['bf16']:.2f}")
    elif args.only_share:
        share, ratio = device_share(args, device, share_precision(args.precision, device))
        if args.cli:
            cli_section(args, device)
        print(f"RESULT device_step_share={share:.3f} seeds_over_1={ratio:.2f} seeds={args.seeds}")
    else:
        full_run(args, device)


if __name__ == "__main__":
    main()
