"""Training speed with the paper's heads on a synthetic 12-agent scenario (N = 1,000, 8:1:1, H = 576, K = 2).

    .venv/bin/python benchmarks/train_speed.py [--seeds 5] [--epochs 2] [--skip-all] [--precision auto]

Configuration (printed): WALLA I heads Linear(576 -> 4096) -> 512 -> 256 -> 1 (projection_dim 4096, the
reference's parametrization), dropout 0.1, batch 100, lr 5e-5, T 2, clip 1.0, no early stop.
Prints:
    1. measured now: the GEMM peaks (n = 2048 square GEMM, best of repeats) of float32 and bf16, the memory
       bandwidth (a fused Adam step on 64M parameters), and the precision "auto" picks (engine.resolve_precision's probe);
    2. WALLA I batched (all agents x all seeds in one StackedHeads module, walla.fit through Lightning
       Fabric) in float32 and bf16-mixed: wall time of fit, the mean step time (between consecutive
       per-step log calls, first interval skipped), model FLOPs per step (forward, weight gradients,
       activation gradients except the input's), MFU = FLOPs / step time / GEMM peak of the dtype used,
       and the memory floor: the bytes each step must move (Adam's fp32 state, gradient, casts; MIN_BYTES
       per parameter of the update that runs: bf16-mixed uses mixed_adam.MasterAdam where it applies) /
       measured bandwidth -> the MFU bound it implies;
    3. test Brier and D-regret of the pooled forecast per seed, float32 vs bf16-mixed (mean +- 95% CI over
       seeds, paired difference); bf16 is used only if both stay within the fp32 seed noise;
    4. the reference's per-agent algorithm with the same heads, implemented as the reference does it: one
       nn.Module and one Adam per agent, a Python loop over agents, a no-grad wager pass then an update
       pass with a fresh forward per agent, per-agent clipping (float32; its training loop only is timed,
       against the whole batched fit call);
    5. every registered method x seeds through its module's fit/predict (the path walla-train takes);
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
from walla.manifests.validate import build  # noqa: E402
from walla.train import mechanism, mixed_adam  # noqa: E402
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


def mem_bandwidth(n: int = 64 * 2**20) -> float:
    """Measured bytes/s that a fused Adam step moves (28 bytes per float32 parameter: reads p, g, m, v,
    writes p, m, v) on n parameters, best of 3: the memory speed the training step's largest pass gets."""
    p = torch.nn.Parameter(torch.zeros(n))
    p.grad = torch.full_like(p, 1e-3)
    opt = torch.optim.Adam([p], lr=1e-3, fused=True)
    opt.step()
    return 28 * n / min(_timed(opt.step) for _ in range(3))


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def batched(data, cfg: walla.Config, seeds: list[int], precision: str) -> dict:
    """WALLA I's batched trainer through fit (all seeds in one module) + test predictions per seed.

    Returns wall seconds of fit, the per-step durations (between consecutive per-step log calls, which
    happen at the same point of every step) and per-seed test Brier / D-regret of the pooled forecast."""
    env, stamps = TrainEnv(precision=precision), []
    t0 = time.perf_counter()
    states = walla.fit(
        data, cfg, seeds, env, [lambda _row: stamps.append(time.perf_counter())] + [None] * (len(seeds) - 1)
    )
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


def roofline(n_params: int, flops: float, peak: float, bw: float, bytes_per_param: int) -> float:
    """Upper bound of MFU when each step must move `bytes_per_param` per parameter through memory (not
    overlapped with the GEMMs: Adam, clipping and casts are separate passes after / before them)."""
    t_mem = n_params * bytes_per_param / bw
    return flops / (t_mem + flops / peak) / peak


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


# bytes per parameter each step must move at least: fused Adam reads p, g, m, v and writes p, m, v (28),
# backward writes the fp32 gradient (4), clipping reads it for the per-head norm (4), the forward reads the
# weight (4). bf16-mixed with mixed_adam.MasterAdam (CPU): the forward and the activation-gradient GEMM read
# the bf16 working copy (2 + 2), backward writes the bf16 gradient (2), clipping reads it (2), one pass reads
# p, m, v, g and writes p, m, v and the bf16 copy (28). bf16-mixed without it (autocast recipe): the 32-true
# bytes + the cast to a bf16 copy (read 4 + write 2) - 2 (GEMMs read bf16) + bf16 gradient written then
# converted into the fp32 one (write 2 + read 2).
MIN_BYTES = {"32-true": 40, "bf16-mixed": 50, "bf16-mixed/MasterAdam": 36}


def min_bytes(precision: str) -> int:
    """MIN_BYTES of the update the batched trainer runs for `precision` here (mixed_adam.stacked_adam)."""
    master = precision == "bf16-mixed" and not mixed_adam.unavailable(precision, torch.device("cpu"))
    return MIN_BYTES[precision + "/MasterAdam" if master else precision]


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
    bw = mem_bandwidth()
    precision = resolve_precision(args.precision, "cpu")
    print(
        f"synthetic scenario N=1000 (8:1:1) M=12 H=576 K=2; {len(seeds)} seeds x {cfg.epochs} epochs; torch "
        f"threads {torch.get_num_threads()}\nWALLA I heads: projection_dim {cfg.projection_dim}, hidden "
        f"{list(cfg.hidden)}, dropout {cfg.dropout}, batch {cfg.batch_size}, lr {cfg.lr}, T {cfg.temperature}"
    )
    print(
        f"measured: GEMM peak float32 {peak['32-true'] / 1e9:.1f} GFLOP/s, bf16 {peak['bf16-mixed'] / 1e9:.1f} "
        f"GFLOP/s; memory bandwidth (fused Adam step) {bw / 1e9:.1f} GB/s"
    )
    why = mixed_adam.unavailable("bf16-mixed", torch.device("cpu"))
    print(
        f"precision: {precision} (requested {args.precision}; engine.resolve_precision's GEMM probe); "
        f"bf16-mixed update: {'autocast recipe, ' + why if why else 'mixed_adam.MasterAdam (one pass)'}"
    )
    walla.train_heads(data, walla.resolve(build(walla.Config, {**HEADS, "epochs": 1}, "w"), data), seeds[:1])
    dims = _layer_dims(576, cfg.hidden, cfg.projection_dim)
    n_params = sum(a * c + c for a, c in zip(dims[:-1], dims[1:], strict=True)) * data.n_agents * len(seeds)
    flops = step_flops(dims, cfg.batch_size) * data.n_agents * len(seeds)  # one full-batch step, all heads
    print(
        f"one step, all {data.n_agents * len(seeds)} heads: {flops / 1e9:.1f} GFLOP, {n_params / 1e6:.0f}M "
        f"parameters ({n_params * 4 / 2**30:.2f} GiB float32)"
    )
    chunks = walla._seed_chunks(data, cfg, seeds)  # fit trains seeds in chunks (memory budget)
    c_flops, c_params = (v * len(chunks[0]) / len(seeds) for v in (flops, n_params))  # first chunk's heads
    print(
        f"fit trains the seeds in chunks of {[len(c) for c in chunks]} (walla.PARAM_BUDGET_BYTES "
        f"{walla.PARAM_BUDGET_BYTES / 2**30:.0f} GiB); step times and MFU below are the first chunk's "
        f"({len(chunks[0]) * data.n_agents} heads, {c_flops / 1e9:.1f} GFLOP per step)"
    )
    runs = {}
    for prec in dict.fromkeys(["32-true", "bf16-mixed" if peak["bf16-mixed"] > 0 else "32-true"]):
        dtype = torch.bfloat16 if prec == "bf16-mixed" else torch.float32
        local = gemm_flops.__wrapped__(dtype, "cpu", 2048)  # re-measured next to the run (shared machine)
        r = runs[prec] = batched(data, cfg, seeds, prec)
        peak[prec] = max(peak[prec], local)  # MFU against the best peak seen in this run (conservative)
        full = r["steps"][1:]  # every batch is full (800 train rows); the first interval warms up
        r["step_s"] = float(np.mean(full))
        r["mfu"] = c_flops / r["step_s"] / peak[prec]
        bound = roofline(c_params, c_flops, peak[prec], bw, min_bytes(prec))
        print(
            f"  batched WALLA I, {prec:<10}: fit {r['secs']:6.2f} s, step {r['step_s']:.3f} s (mean of "
            f"{len(full)} steps) = {c_flops / r['step_s'] / 1e9:.1f} GFLOP/s, MFU {r['mfu']:.3f} of the "
            f"{prec} GEMM peak; memory floor {c_params * min_bytes(prec) / 1e9:.1f} GB/step = "
            f"{c_params * min_bytes(prec) / bw:.3f} s -> MFU bound {bound:.3f}"
        )
    if "bf16-mixed" in runs and precision == "bf16-mixed":
        if not same_within_noise(runs["32-true"], runs["bf16-mixed"]):
            print("bf16-mixed results are NOT within seed noise of float32: keeping 32-true")
            precision = "32-true"
        else:
            print("bf16-mixed results are within seed noise of float32")
    t_loop = sum(per_agent_loop(data, cfg, s) for s in seeds)
    secs, n_steps = runs[precision]["secs"], len(runs[precision]["steps"]) + 1
    fwd = 2.0 * cfg.batch_size * sum(a * c for a, c in zip(dims[:-1], dims[1:], strict=True))  # its 2nd pass
    loop_flops = (flops + fwd * data.n_agents * len(seeds)) * n_steps
    floor = n_steps * (n_params * min_bytes(precision) / bw + flops / peak[precision])
    print(
        f"  per-agent loop (reference algorithm, float32, training loop only): {t_loop:7.2f} s = "
        f"{loop_flops / t_loop / 1e9:.1f} GFLOP/s ({loop_flops / t_loop / peak['32-true']:.2f} of the fp32 "
        f"peak; it runs a second forward pass); batched fit ({precision}, init + Fabric + steps + best "
        f"state): {secs:.2f} s, its steps alone ~{runs[precision]['step_s'] * n_steps * len(seeds) / len(chunks[0]):.2f} s"
        f"\n  speedup bound: loop time / (steps x (memory floor + GEMMs at peak)) = {t_loop / floor:.2f}"
    )
    total = math.nan if args.skip_all else all_methods(data, seeds, args.epochs)
    print(
        f"RESULT walla_train_mfu={runs[precision]['mfu']:.3f} walla_speedup_vs_loop={t_loop / secs:.2f} "
        f"all_methods_5_seeds_s={total:.2f}"
    )


if __name__ == "__main__":
    main()
