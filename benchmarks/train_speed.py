"""Training speed with the paper's heads on a synthetic 12-agent scenario (N = 1,000, 8:1:1, H = 576, K = 2).

    .venv/bin/python benchmarks/train_speed.py [--seeds 5] [--epochs 2] [--skip-all] [--precision auto]

Configuration (printed): WALLA I heads Linear(576 -> 4096) -> 512 -> 256 -> 1 (projection_dim 4096, the
reference's parametrization), dropout 0.1, batch 100, lr 5e-5, T 2, clip 1.0, no early stop.
Prints:
    1. the machine's GEMM peaks, measured now (n = 2048 square GEMM, best of repeats): float32 and bf16;
       the precision "auto" picks from them (engine.resolve_precision);
    2. WALLA I batched (all agents x all seeds in one StackedHeads module through Lightning Fabric), in
       float32 and in the chosen precision: wall time of the training steps, model FLOPs (forward, weight
       gradients, activation gradients except the input's), MFU = FLOPs / time / peak of the dtype used;
    3. the reference's per-agent algorithm with the same heads, implemented as the reference does it: one
       nn.Module and one Adam per agent, a Python loop over agents, a no-grad wager pass then an update
       pass with a fresh forward per agent, per-agent clipping;
    4. every registered method x seeds through its module's fit/predict (the path walla-train takes);
       a method that cannot run here is excluded and named with the reason.
Last line: RESULT walla_train_mfu=<x> walla_speedup_vs_loop=<x> all_methods_5_seeds_s=<x>
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "train"))
from synthetic import make_private_context_scenario  # noqa: E402
from walla.store.validate import build  # noqa: E402
from walla.train import mechanism  # noqa: E402
from walla.train.engine import TrainEnv, gemm_flops, resolve_precision, seeded  # noqa: E402
from walla.train.heads import WagerHead, _layer_dims  # noqa: E402
from walla.train.methods import REGISTRY, get_method, walla  # noqa: E402

HEADS = {"lr": 5e-5, "batch_size": 100, "projection_dim": 4096, "hidden": [512, 256], "patience": 10**9}


def step_flops(dims: list[int], b: int) -> float:
    """Model FLOPs of one training step of one head: forward + weight grads + activation grads (not dx)."""
    macs = [a * c for a, c in zip(dims[:-1], dims[1:], strict=True)]
    return 2.0 * b * (2 * sum(macs) + sum(macs[1:]))


def per_agent_loop(data, cfg: walla.Config, seed: int) -> float:
    """The reference's training loop for one seed (no early stopping): returns wall seconds."""
    train = data.split_index("train")
    x = [torch.from_numpy(np.asarray(h[train], dtype=np.float32)) for h in data.hidden]  # [n, H] each
    probs = torch.from_numpy(np.asarray(data.probs[train], dtype=np.float64))  # [n, M, K]
    target = torch.from_numpy(np.asarray(data.target[train], dtype=np.float64))  # [n, K]
    with seeded(seed):
        heads = [WagerHead(h.shape[1], cfg.hidden, cfg.dropout, cfg.projection_dim) for h in x]
    opts = [torch.optim.Adam(h.parameters(), lr=cfg.lr) for h in heads]
    order = np.random.default_rng(seed).permutation(len(train))
    t0 = time.perf_counter()
    with seeded(seed):
        for _epoch in range(cfg.epochs):
            for start in range(0, len(order), cfg.batch_size):
                rows = torch.from_numpy(order[start : start + cfg.batch_size])
                p, y = probs[rows], target[rows]
                for h in heads:
                    h.train()
                with torch.no_grad():  # compute_wagers (train mode) -> aggregate -> batch metric
                    w = torch.stack(
                        [
                            torch.sigmoid(h(xi[rows]) / cfg.temperature)
                            for h, xi in zip(heads, x, strict=True)
                        ],
                        1,
                    )
                    float(mechanism.brier_regret(mechanism.pool(p, w.double(), validate=False), p, y).mean())
                w_new = [
                    torch.sigmoid(h(xi[rows]).double() / cfg.temperature)
                    for h, xi in zip(heads, x, strict=True)
                ]
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
    return time.perf_counter() - t0


def batched(data, cfg: walla.Config, seeds: list[int], precision: str) -> tuple[float, int]:
    """Wall seconds and steps of WALLA I's batched trainer (all seeds in one module)."""
    t0 = time.perf_counter()
    th = walla.train_heads(data, cfg, seeds, TrainEnv(precision=precision))
    return time.perf_counter() - t0, th.steps


def all_methods(data, seeds: list[int], epochs: int) -> float:
    total, excluded = 0.0, []
    for name, info in REGISTRY.items():
        try:
            _, mod = get_method(name)
            raw = dict(info.defaults)
            if info.path.endswith(".walla"):
                raw.update({**HEADS, "epochs": epochs, "patience": 1500})
            cfg = build(mod.Config, raw, name)
            cfg = mod.resolve(cfg, data) if hasattr(mod, "resolve") else cfg
            t0 = time.perf_counter()
            env = TrainEnv()
            states = mod.fit(data, cfg, seeds, env, [None] * len(seeds))
            for st in states:
                mod.predict(st, data, data.split_index("test"), env)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--skip-all", action="store_true", help="only the WALLA comparison")
    args = ap.parse_args()
    seeds = [18 + r for r in range(args.seeds)]
    data = make_private_context_scenario(n=1000, m=12, k=2, h=576, seed=0, name="bench-train-speed")
    cfg = walla.resolve(build(walla.Config, {**HEADS, "epochs": args.epochs}, "bench"), data)
    peak = {
        "32-true": gemm_flops(torch.float32, "cpu", 2048),
        "bf16-mixed": gemm_flops(torch.bfloat16, "cpu", 2048),
    }
    precision = resolve_precision(args.precision, "cpu")
    print(
        f"synthetic scenario N=1000 (8:1:1) M=12 H=576 K=2; {len(seeds)} seeds x {cfg.epochs} epochs; torch "
        f"threads {torch.get_num_threads()}\nWALLA I heads: projection_dim {cfg.projection_dim}, hidden "
        f"{list(cfg.hidden)}, dropout {cfg.dropout}, batch {cfg.batch_size}, lr {cfg.lr}, T {cfg.temperature}"
    )
    print(
        f"GEMM peak (measured): float32 {peak['32-true'] / 1e9:.1f} GFLOP/s, bf16 {peak['bf16-mixed'] / 1e9:.1f} GFLOP/s"
    )
    print(f"precision: {precision} (requested {args.precision})")
    walla.train_heads(data, walla.resolve(build(walla.Config, {**HEADS, "epochs": 1}, "w"), data), seeds[:1])
    n_train = len(data.split_index("train"))
    dims = _layer_dims(576, cfg.hidden, cfg.projection_dim)
    flops_per_seed = (
        sum(
            step_flops(dims, min(cfg.batch_size, n_train - t * cfg.batch_size)) * data.n_agents
            for t in range(math.ceil(n_train / cfg.batch_size))
        )
        * cfg.epochs
    )
    runs = {}
    for prec in dict.fromkeys(["32-true", precision]):
        secs, steps = batched(data, cfg, seeds, prec)
        mfu = flops_per_seed * len(seeds) / secs / peak.get(prec, peak["32-true"])
        runs[prec] = (secs, mfu)
        print(
            f"  batched WALLA I, {prec:<10}: {secs:7.2f} s ({steps} steps, "
            f"{flops_per_seed * len(seeds) / secs / 1e9:.1f} GFLOP/s, MFU {mfu:.3f} of the {prec} GEMM peak)"
        )
    t_loop = sum(per_agent_loop(data, cfg, s) for s in seeds)
    print(f"  per-agent loop (reference algorithm, float32): {t_loop:7.2f} s")
    total = math.nan if args.skip_all else all_methods(data, seeds, args.epochs)
    secs, mfu = runs[precision]
    print(
        f"RESULT walla_train_mfu={mfu:.3f} walla_speedup_vs_loop={t_loop / secs:.2f} all_methods_5_seeds_s={total:.2f}"
    )


if __name__ == "__main__":
    main()
