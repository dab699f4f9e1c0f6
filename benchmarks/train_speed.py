"""Training speed on a synthetic 12-agent scenario (N = 1,000, 8:1:1, H = 576, K = 2; no LLM).

    .venv/bin/python benchmarks/train_speed.py [--seeds 5] [--epochs 5] [--skip-all]

Prints:
    1. wall time of every registered method x 5 seeds through walla.train.run.run_scenario (the path
       `walla-train` takes), with the hyper-parameters of the homogeneous 12-agent PubMedQA scenario
       (manifests/scenarios/homo-pubmedqa-aloe-x12.yaml); a method whose module cannot be imported is
       excluded and named;
    2. WALLA I alone: our batched trainer (all agents x all seeds in one module, plain-loop engine and
       Lightning engine) vs a faithful per-agent loop as in the reference (one nn.Module, one Adam and one
       Python iteration per agent per batch, a no-grad wager pass then an update pass with a fresh
       dropout mask, per-agent clipping, deep copy of every head on a window improvement), on identical
       data, epochs and early-stopping settings.
Last line: RESULT all_methods_5_seeds_s=<x> walla_speedup_vs_loop=<x>
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "train"))
from synthetic import make_private_context_scenario  # noqa: E402
from walla.train import mechanism  # noqa: E402
from walla.train.heads import WagerHead  # noqa: E402
from walla.train.lit import seeded  # noqa: E402
from walla.train.methods import REGISTRY, walla  # noqa: E402
from walla.train.run import method_config, run_scenario  # noqa: E402

SCENARIO_HPARAMS = "homo-pubmedqa-aloe-x12"


def scenario_hparams() -> dict[str, dict]:
    """Resolved per-method hyper-parameters of the reference 12-agent homogeneous scenario."""
    try:
        from walla.store.manifests import load_scenario

        return dict(load_scenario(SCENARIO_HPARAMS).hparams)
    except Exception as e:  # the benchmark still runs with registry defaults
        print(f"(could not load {SCENARIO_HPARAMS}: {e}; using registry defaults)")
        return {}


def per_agent_loop(data, cfg: dict, seed: int) -> float:
    """The reference's training loop for one seed: returns wall seconds."""
    c = walla._config(data, cfg)
    train = data.split_index("train")
    x = [torch.from_numpy(np.asarray(h[train], dtype=np.float32)) for h in data.hidden]  # [n, H] each
    probs = torch.from_numpy(data.probs[train])  # [n, M, K]
    target = torch.from_numpy(data.target[train])  # [n, K]
    with seeded(seed):
        heads = [WagerHead(h.shape[1], c.hidden, c.dropout, c.projection_dim) for h in x]
    opts = [torch.optim.Adam(h.parameters(), lr=c.lr) for h in heads]
    order = np.random.default_rng(seed).permutation(len(train))
    window: deque = deque(maxlen=int(c.window))
    best_val, bad, best_state = math.inf, 0, None
    t0 = time.perf_counter()
    for _epoch in range(c.epochs):
        for start in range(0, len(order), c.batch_size):
            rows = torch.from_numpy(order[start : start + c.batch_size])
            p, y = probs[rows], target[rows]
            for h in heads:
                h.train()
            with torch.no_grad():  # compute_wagers (train mode) -> aggregate -> batch metric
                w = torch.stack(
                    [torch.sigmoid(h(xi[rows]) / c.temperature) for h, xi in zip(heads, x, strict=True)], 1
                )
                agg = mechanism.pool(p, w, c.pooling, validate=False)
                metric = float(walla._stop_metric(c.stop_metric, agg, p, y).mean())
            # update(): a fresh forward per agent, targets from these wagers, one step per agent
            w_new = [torch.sigmoid(h(xi[rows]) / c.temperature) for h, xi in zip(heads, x, strict=True)]
            with torch.no_grad():
                adv = mechanism.advantage(
                    p, torch.stack([wi.detach() for wi in w_new], 1), y, c.variant, validate=False
                )
                w_star = mechanism.best_response_wager(adv, c.c3, w_max=1.0)
            for i, (h, opt) in enumerate(zip(heads, opts, strict=True)):
                loss = ((w_new[i] - w_star[:, i]) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(h.parameters(), c.clip)
                opt.step()
            window.append((metric, len(rows)))
            if len(window) == window.maxlen:
                val = sum(v * n for v, n in window) / sum(n for _, n in window)
                if val < best_val:
                    best_val, bad = val, 0
                    best_state = [copy.deepcopy(h.state_dict()) for h in heads]
                else:
                    bad += 1
                    if bad >= c.patience:
                        break
    assert best_state is not None or c.epochs * math.ceil(len(order) / c.batch_size) < c.window
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--skip-all", action="store_true", help="only the WALLA batched-vs-loop comparison")
    args = ap.parse_args()
    seeds = [18 + r for r in range(args.seeds)]
    data = make_private_context_scenario(n=1000, m=12, k=2, h=576, seed=0, name="bench-train-speed")
    hp = scenario_hparams()
    print(
        f"synthetic scenario: N=1000 (8:1:1), M=12, H=576, K=2; {len(seeds)} seeds; torch threads "
        f"{torch.get_num_threads()}; hyper-parameters of {SCENARIO_HPARAMS}"
    )

    # ---- 1. every registered method x seeds, the walla-train path ----------------------------------
    total = math.nan
    if not args.skip_all:
        usable, missing = [], []
        for name, info in REGISTRY.items():
            try:
                __import__(info.path)
                usable.append(name)
            except ImportError as e:
                missing.append(f"{name} ({e})")
        if missing:
            print("excluded (module missing): " + "; ".join(missing))
        entry = SimpleNamespace(hparams=hp, calibrated=False)
        with tempfile.TemporaryDirectory() as runs:
            per_method = {}
            t_all = time.perf_counter()
            for name in usable:
                t0 = time.perf_counter()
                run_scenario(data, [name], seeds, runs, entry=entry)
                per_method[name] = time.perf_counter() - t0
            total = time.perf_counter() - t_all
        for name, s in per_method.items():
            cfg = method_config(name, entry)
            print(f"  {name:<16} {s:7.2f} s  ({len(seeds)} seeds)  cfg: {cfg}")
        print(
            f"all {len(usable)} methods x {len(seeds)} seeds: {total:.2f} s "
            f"({'all registered methods' if not missing else f'{len(missing)} excluded'})"
        )

    # ---- 2. WALLA I: batched trainer vs the reference's per-agent loop ------------------------------
    cfg = {**method_config("walla-i", SimpleNamespace(hparams=hp)), "patience": 10**9}
    walla.fit_many(data, {**cfg, "epochs": 1}, seeds[:1])  # warm-up (first-call allocations)
    timings = {}
    for engine in ("loop", "lightning"):
        t0 = time.perf_counter()
        walla.fit_many(data, {**cfg, "engine": engine}, seeds)
        timings[engine] = time.perf_counter() - t0
    t_loop = sum(per_agent_loop(data, cfg, s) for s in seeds)
    c = walla._config(data, cfg)
    print(f"WALLA I, {len(seeds)} seeds x {c.epochs} epochs x 12 agents (lr {c.lr}, batch {c.batch_size}):")
    print(f"  batched, plain-loop engine : {timings['loop']:7.2f} s")
    print(f"  batched, Lightning engine  : {timings['lightning']:7.2f} s")
    print(f"  per-agent loop (reference): {t_loop:7.2f} s")
    speedup = t_loop / timings["loop"]
    print(f"RESULT all_methods_5_seeds_s={total:.2f} walla_speedup_vs_loop={speedup:.2f}")


if __name__ == "__main__":
    main()
