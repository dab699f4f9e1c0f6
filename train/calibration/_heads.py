"""Temperature heads: small MLPs that map an agent's hidden state to a temperature, and the scaled
distribution softmax(log p / T) they are trained and applied with (calibration/temperature.py, SPEC §9).

    heads = TempHeads(in_dims, hidden=(256, 64), t0=1.0, t_min=0.05, t_max=10.0, seed=18, device="cpu")
    t = heads(x)                                       # x [G, B, Hmax] -> T [G, B]
    logq = scaled(log_probs(probs, mask), t, mask)     # log softmax(log p / T) over enabled options

All G heads evaluate together (torch.baddbmm over their stacked weights), but each keeps its own
parameter tensors, so an optimizer with one param group per head updates each exactly as if alone. The
hidden layers get nn.Linear's default init, drawn on the device from a generator seeded per head
(engine.init_generator); the last layer starts at zero weight, so an untrained head's T is t0.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from walla.train.engine import init_generator, linear_init_


class TempHead(nn.Module):
    """One agent's (role's) temperature MLP: weights[j] [d_j, d_j+1] (input rows zero-padded to Hmax).

    `init`: nn.Linear's default init of the hidden layers (fan_in = the agent's real H) drawn on `device`
    from a generator seeded with `seed`; False leaves zeros (a state is loaded next).
    """

    def __init__(
        self,
        in_dim: int,
        h_max: int,
        hidden: tuple[int, ...],
        t0: float,
        t_min: float,
        seed: int,
        device: torch.device,
        init: bool,
    ) -> None:
        super().__init__()
        dims = [h_max, *hidden, 1]
        pairs = list(zip(dims[:-1], dims[1:], strict=True))
        self.weights = nn.ParameterList(nn.Parameter(torch.zeros(a, b, device=device)) for a, b in pairs)
        self.biases = nn.ParameterList(nn.Parameter(torch.zeros(b, device=device)) for _, b in pairs)
        if not init:
            return
        gen = init_generator(seed, device)
        with torch.no_grad():
            for j, fan_in in enumerate([in_dim, *hidden[:-1]]):
                linear_init_(self.weights[j][:fan_in], self.biases[j], gen)
            # last layer: zero weight, bias softplus^-1(t0 - t_min), so T starts at t0
            self.biases[-1].fill_(math.log(math.expm1(t0 - t_min)))


class TempHeads(nn.Module):
    """G temperature MLPs evaluated together: x [G, B, Hmax] -> T [G, B] (head g reads slice g).

    T = min(softplus(out) + t_min, t_max); head g's hidden layers are drawn from seed + g, its last layer
    starts at T = t0 (TempHead).
    """

    def __init__(
        self,
        in_dims: list[int],
        hidden: tuple[int, ...],
        t0: float,
        t_min: float,
        t_max: float,
        seed: int,
        device: str | torch.device = "cpu",
        init: bool = True,
    ) -> None:
        super().__init__()
        self.hidden, self.t_min, self.t_max = tuple(hidden), t_min, t_max
        h_max, dev = max(in_dims), torch.device(device)
        self.heads = nn.ModuleList(
            TempHead(d, h_max, hidden, t0, t_min, seed + g, dev, init) for g, d in enumerate(in_dims)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x  # [G, B, Hmax]
        last = len(self.hidden)
        for j in range(last + 1):
            w = torch.stack([head.weights[j] for head in self.heads])  # [G, d_j, d_j+1]
            b = torch.stack([head.biases[j] for head in self.heads])  # [G, d_j+1]
            h = torch.baddbmm(b.unsqueeze(1), h, w)  # [G, B, d_j+1]
            if j < last:
                h = torch.relu(h)
        t = nn.functional.softplus(h.squeeze(-1)) + self.t_min  # [G, B]
        return t.clamp(max=self.t_max)

    def stacked(self) -> list[torch.Tensor]:
        """Every head's parameters stacked per layer [G, ...]: weights, then biases (the state format)."""
        per_head = [list(head.weights) + list(head.biases) for head in self.heads]
        return [torch.stack([ps[i].detach() for ps in per_head]) for i in range(len(per_head[0]))]

    @torch.no_grad()
    def load_stacked(self, params: list[torch.Tensor]) -> None:
        for g, head in enumerate(self.heads):
            for p, v in zip(list(head.weights) + list(head.biases), params, strict=True):
                p.copy_(v[g])


def log_probs(probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log p on enabled options, 0 on disabled ones: probs [..., K], mask [..., K] bool.

    Finite, so d(logp / T)/dT never sees -inf * 0; `scaled` masks them out.
    """
    return torch.where(mask, probs.clamp_min(1e-30).log(), torch.zeros_like(probs))


def scaled(logp: torch.Tensor, temp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log softmax(logp / T) over enabled options. logp [..., K], temp [...]."""
    z = logp / temp.unsqueeze(-1)  # [..., K]
    return torch.log_softmax(z.masked_fill(~mask, -math.inf), dim=-1)


def nll(logq: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Cross-entropy -sum_k y_k log q_k over enabled options -> [...]."""
    return -(torch.where(mask, target * logq, torch.zeros_like(logq))).sum(-1)
