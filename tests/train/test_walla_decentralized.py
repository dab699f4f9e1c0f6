"""WALLA's batched trainer is exactly decentralized: each agent's update equals training it alone.

An agent trained alone (a plain nn.Module with its own Adam and its own grad clipping) that sees only
its own hidden states, the recorded dropout masks and the realized advantage computed from the
recorded OPPONENTS' wagers must end with the same parameters as its slice of the batched module.
"""

from __future__ import annotations

import numpy as np
import torch
from synthetic import make_private_context_scenario
from walla.manifests.validate import build
from walla.train import mechanism
from walla.train.engine import TrainEnv
from walla.train.methods import walla
from walla.train.wagers import StackedHeads, init_heads, train_heads

RAW = {
    "variant": "II",
    "lr": 5e-3,
    "epochs": 2,
    "batch_size": 40,
    "hidden": [16, 8],
    "patience": 10**6,
    "clip": 0.05,  # small, so the per-agent clipping is active in most steps
    "projection_dim": None,
}
CFG = build(walla.Config, RAW, "test")
ENV = TrainEnv()


def _fit(data, cfg, seeds):
    return walla.fit(data, cfg, seeds, ENV, [None] * len(seeds))


def _solo_replay(data, cfg, records, init: StackedHeads, s: int, agent: int) -> torch.nn.Module:
    """Train agent `agent` of seed index `s` alone against the recorded opponents' wagers."""
    m = data.n_agents
    g = s * m + agent
    solo = init.head(g)  # plain WagerHead on the agent's real hidden size
    solo.train()
    opt = torch.optim.Adam(solo.parameters(), lr=cfg.lr)
    train = data.split_index("train")
    for rec in records:
        rows = train[rec["idx"][s].numpy()]
        x = torch.from_numpy(np.asarray(data.hidden[agent][rows], dtype=np.float32))  # [b, H_i]
        masks = [mk[g] for mk in rec["masks"]]  # this agent's own dropout masks
        w = torch.sigmoid(solo(x, masks) / cfg.temperature)  # [b]
        wagers = rec["wagers"][s].clone()  # [b, M] recorded wagers of this seed
        wagers[:, agent] = 0.123  # own entry must not matter: b_-i depends on the others only
        p = torch.from_numpy(data.probs[rows])
        y = torch.from_numpy(data.target[rows])
        adv = mechanism.advantage(p, wagers, y, cfg.variant, cfg.c1, cfg.c2)[:, agent]  # [b]
        w_star = (adv / (2 * cfg.c3)).clamp(0, 1)
        loss = ((w - w_star) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(solo.parameters(), cfg.clip)
        opt.step()
    return solo


def test_each_agent_equals_training_alone_hetero_hidden_sizes():
    data = make_private_context_scenario(n=300, m=3, k=3, h=[12, 20, 9], seed=3, min_options=2)
    records = []
    th = train_heads(data, walla.resolve(CFG, data), [18, 19], trace=records.append)
    cfg = th.cfg
    assert th.steps == len(records) == 2 * int(np.ceil(len(data.split_index("train")) / 40))
    init = init_heads([18, 19], th.in_dims, cfg, 1)
    trained = StackedHeads(th.in_dims * 2, cfg.hidden, cfg.dropout, init=False)
    trained.load_rows(slice(None), th.last)
    for s, agent in [(0, 0), (0, 1), (1, 2)]:
        solo = _solo_replay(data, cfg, records, init, s, agent)
        batched = trained.head(s * data.n_agents + agent)
        start = init.head(s * 3 + agent).parameters()
        moved = max((a - b).abs().max().item() for a, b in zip(solo.parameters(), start, strict=True))
        assert moved > 1e-3  # training did something
        for a, b in zip(solo.parameters(), batched.parameters(), strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    # zero-padded input rows of the smaller agents never move
    w0 = trained.weights[0]
    assert torch.equal(w0[2, 9:], torch.zeros_like(w0[2, 9:]))


def test_diagnostic_heads_never_influence_wagers():
    data = make_private_context_scenario(n=200, m=3, k=2, h=10, seed=5)
    plain = train_heads(data, walla.resolve(CFG, data), [7])
    diag_cfg = build(walla.Config, {**RAW, "diagnostics": True}, "test")
    diag = train_heads(data, walla.resolve(diag_cfg, data), [7])
    m = data.n_agents
    for a, b in zip(plain.last, diag.last, strict=True):
        torch.testing.assert_close(a[:m], b[:m], atol=1e-6, rtol=1e-6)  # wager heads = first M rows


def test_seed_trajectory_independent_of_batch_companions():
    data = make_private_context_scenario(n=200, m=3, k=2, h=10, seed=6)
    cfg = build(walla.Config, {**RAW, "patience": 3, "window": 2}, "test")
    together = _fit(data, cfg, [18, 19, 20])
    (alone,) = _fit(data, cfg, [19])
    assert together[1]["seed"] == 19 and together[1]["best_step"] == alone["best_step"]
    for a, b in zip(together[1]["params"], alone["params"], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
