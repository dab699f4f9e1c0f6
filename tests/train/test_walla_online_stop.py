"""OnlineStop's lazy best-state copy equals copying the state after every improving batch."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
from torch import nn
from walla.train.wagers import OnlineStop


def test_lazy_best_copy_equals_eager_copy():
    gen = torch.Generator().manual_seed(0)
    s_n, a_n = 3, 2
    heads = nn.ParameterList([nn.Parameter(torch.zeros(s_n * a_n, 4)), nn.Parameter(torch.zeros(s_n * a_n))])
    stop = OnlineStop(SimpleNamespace(window=2, patience=4), heads, s_n, a_n, None)
    eager = [p.detach().clone() for p in heads]
    best_val = [math.inf] * s_n
    ring, copies = [], 0
    for step in range(1, 40):
        metric = torch.rand(s_n, generator=gen, dtype=torch.float64)
        metric[0] = 1.0 / step  # seed 0 improves on every full window: always pending, never copied
        summary = {
            "metric": metric,
            "mse": torch.zeros(s_n, a_n),
            "wager": metric[:, None],
            "adv": metric[:, None],
        }
        stop.update(step, 0, 10, summary, torch.zeros(s_n, a_n))
        with torch.no_grad():  # "optimizer step"
            for p in heads:
                p.add_(torch.randn(p.shape, generator=gen))
        ring = (ring + [metric])[-2:]  # the eager reference: copy the post-update state on improvement
        if len(ring) == 2:
            wm = (ring[0] + ring[1]) / 2
            for s in range(s_n):
                if stop.stop_step[s] is not None and stop.stop_step[s] < step:
                    continue
                if float(wm[s]) < best_val[s]:
                    best_val[s] = float(wm[s])
                    rows = slice(s * a_n, (s + 1) * a_n)
                    for e, p in zip(eager, heads, strict=True):
                        e[rows] = p.detach()[rows]
                        copies += 1
    assert stop.pending[0] and copies > 0
    assert stop.stop_step[1] is not None or stop.stop_step[2] is not None  # patience ran out somewhere
    best = stop.best_or_last([p.detach().clone() for p in heads])
    for b, e in zip(best, eager, strict=True):
        torch.testing.assert_close(b, e, atol=0, rtol=0)
