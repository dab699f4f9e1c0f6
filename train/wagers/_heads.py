"""Wager heads: one small MLP per agent on that agent's own last-layer hidden state (SPEC §5.1).

    WagerHead(in_dim)             one agent's head, a plain nn.Module: x [B, H] -> raw score r [B]
    StackedHeads(in_dims)         G independent heads evaluated as ONE module (torch.baddbmm over
                                  stacked parameters, autograd's own backward): x [G, B, Hmax] ->
                                  r [G, B]; head g only ever touches slice g of every parameter, so
                                  its gradient, Adam state and clipping (clipping.clip_gradients,
                                  scope "slice") are exactly those of a separately trained WagerHead.

Architecture (paper: "a two-layer perceptron (512, 256)"): [Linear(H -> P)] -> Linear(-> 512) ->
ReLU -> Dropout(0.1) -> Linear(512 -> 256) -> ReLU -> Dropout(0.1) -> Linear(256 -> 1). The
projection P = `projection_dim` (4096 in the reference, the default of WALLA's Config) has no
nonlinearity after it: same function class as without it (SPEC §5.1 note), but different Adam dynamics,
so the parameters stay as the reference has them.

Order of computation (exact, only reassociated where no nonlinearity intervenes). Per head and batch
of b rows, H = 576, P = 4096, D = 512: training computes (x Wp + bp) W1 as written: forward
2 b P (H + D), weight gradients 2 b P (H + D), the activation gradient dz W1^T 2 b P D (no input
gradient) = 2.2 GFLOP at b = 100; folding M = Wp W1 first costs 2 H P D = 2.4 GFLOP per step for M
alone and 6 H P D through the backward, so it only pays when b > H D / (H + D) = 271. Evaluation
(`predict`, no gradients, thousands of rows) therefore folds the projection into the first layer.

Heterogeneous ensembles (different H_i) are zero-padded to Hmax: padded input coordinates are
always 0, so their weights get zero gradient, zero Adam moments and never move or contribute.
Initialization is nn.Linear's default per head, with fan_in = the head's real H_i: copied from a WagerHead
(`init=True`, torch's global RNG) or drawn in place on the parameters' device from a seeded generator
(`init_head_`, engine.linear_init_: the same values on the CPU).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from walla.train.engine import linear_init_


def _layer_dims(in_dim: int, hidden: Sequence[int], projection_dim: int | None) -> list[int]:
    return [in_dim] + ([projection_dim] if projection_dim else []) + list(hidden) + [1]


class WagerHead(nn.Module):
    """One agent's head (reference layout). x [B, H] -> r [B] (raw score; wager = sigmoid(r / T))."""

    def __init__(
        self,
        in_dim: int,
        hidden: Sequence[int] = (512, 256),
        dropout: float = 0.1,
        projection_dim: int | None = None,
        device: str | torch.device = "cpu",
    ) -> None:
        super().__init__()
        dims = _layer_dims(in_dim, hidden, projection_dim)
        pairs = zip(dims[:-1], dims[1:], strict=True)
        self.layers = nn.ModuleList(nn.Linear(a, b, device=device) for a, b in pairs)
        self.n_proj = 1 if projection_dim else 0  # leading layers without activation
        self.dropout = dropout

    def forward(self, x: torch.Tensor, masks: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
        """x [B, H] -> r [B].

        `masks`: optional explicit dropout keep-masks (one [B, width] per hidden layer, values 0/1);
        without them nn.functional.dropout is used (train mode) or nothing (eval mode).
        """
        h = x  # [B, H]
        for j, layer in enumerate(self.layers):
            h = layer(h)  # [B, d_j]
            if j < self.n_proj or j == len(self.layers) - 1:
                continue
            h = torch.relu(h)
            k = j - self.n_proj
            if masks is not None:
                h = h * masks[k].to(h.dtype) / (1.0 - self.dropout)
            elif self.training and self.dropout > 0:
                h = nn.functional.dropout(h, self.dropout, training=True)
        return h.squeeze(-1)  # [B]


class StackedHeads(nn.Module):
    """G independent WagerHeads as stacked parameters: weights[j] [G, d_j, d_j+1], biases[j] [G, d_j+1].

    Head g only ever touches slice g of every parameter; Adam is elementwise, so slice g's update is
    exactly that of head g trained alone (with per-slice clipping, clipping.clip_gradients(scope="slice")).
    """

    def __init__(
        self,
        in_dims: Sequence[int],
        hidden: Sequence[int] = (512, 256),
        dropout: float = 0.1,
        projection_dim: int | None = None,
        init: bool = True,
        device: str | torch.device = "cpu",
    ) -> None:
        super().__init__()
        self.in_dims = [int(d) for d in in_dims]
        self.hidden, self.dropout, self.projection_dim = tuple(hidden), dropout, projection_dim
        self.n_proj = 1 if projection_dim else 0
        self.dims = _layer_dims(max(self.in_dims), hidden, projection_dim)
        g = len(self.in_dims)
        pairs = list(zip(self.dims[:-1], self.dims[1:], strict=True))
        self.weights = nn.ParameterList(nn.Parameter(torch.zeros(g, a, b, device=device)) for a, b in pairs)
        self.biases = nn.ParameterList(nn.Parameter(torch.zeros(g, b, device=device)) for _, b in pairs)
        if init:
            for i, d in enumerate(self.in_dims):
                self.load_head(i, WagerHead(d, hidden, dropout, projection_dim))

    @torch.no_grad()
    def load_head(self, g: int, head: WagerHead) -> None:
        """Copy a WagerHead's parameters into slice g (zero-padding input rows beyond its H_g)."""
        for j, layer in enumerate(head.layers):
            w = layer.weight.detach().T  # [d_in, d_out]
            self.weights[j][g, : w.shape[0]] = w
            self.weights[j][g, w.shape[0] :].zero_()  # padding rows only
            self.biases[j][g] = layer.bias.detach()

    @torch.no_grad()
    def init_head_(self, g: int, generator: torch.Generator) -> None:
        """Head g's default init drawn in place from `generator` (on the parameters' device).

        Layer by layer, weight then bias, as WagerHead(H_g) draws them; the padding rows beyond H_g stay 0.
        """
        for j, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            fan_in = self.in_dims[g] if j == 0 else w.shape[1]
            linear_init_(w[g, :fan_in], b[g], generator)

    @torch.no_grad()
    def head(self, g: int) -> WagerHead:
        """Slice g as a plain WagerHead (same function; for inspection and tests)."""
        out = WagerHead(self.in_dims[g], self.hidden, self.dropout, self.projection_dim)
        for j, layer in enumerate(out.layers):
            layer.weight.copy_(self.weights[j][g, : layer.in_features].T)
            layer.bias.copy_(self.biases[j][g])
        return out

    @torch.no_grad()
    def load_rows(self, rows: slice, values: Sequence[torch.Tensor]) -> None:
        for p, v in zip(self.parameters(), values, strict=True):
            p[rows] = v

    def forward(self, x: torch.Tensor, masks: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
        """x [G, B, Hmax] (zero-padded) -> raw scores r [G, B].

        `masks`: explicit dropout keep-masks, one [G, B, width] per hidden layer (0/1 floats); None means
        no dropout (eval). Explicit masks let callers draw them from per-seed generators.
        """
        h = x  # [G, B, Hmax]
        last = len(self.weights) - 1
        for j, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            h = torch.baddbmm(b.unsqueeze(1), h, w)  # [G, B, d_j+1]
            if j < self.n_proj or j == last:
                continue
            h = torch.relu(h)
            if masks is not None:
                keep = masks[j - self.n_proj].to(h.dtype)
                h = h * keep * (1.0 / (1.0 - self.dropout))  # [G, B, d_j+1]
        return h.squeeze(-1)  # [G, B]

    @torch.no_grad()
    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Eval-mode forward (no dropout) of x [G, n, Hmax] -> r [G, n].

        The projection is folded into the first layer when that is cheaper (n > H D / (H + D); see the
        module docstring): the same function up to rounding.
        """
        if not self.n_proj or x.shape[1] * (x.shape[2] + self.dims[2]) <= x.shape[2] * self.dims[2]:
            return self(x)
        wp, bp, w1, b1 = self.weights[0], self.biases[0], self.weights[1], self.biases[1]
        w = torch.bmm(wp, w1)  # [G, Hmax, D]
        b = torch.baddbmm(b1.unsqueeze(1), bp.unsqueeze(1), w1)  # [G, 1, D]
        h = torch.relu(torch.baddbmm(b, x, w))  # [G, n, D]
        for j in range(2, len(self.weights)):
            h = torch.baddbmm(self.biases[j].unsqueeze(1), h, self.weights[j])
            if j < len(self.weights) - 1:
                h = torch.relu(h)
        return h.squeeze(-1)  # [G, n]


def stack_hidden(
    hidden: Sequence,
    rows: np.ndarray,
    device: str | torch.device | None = None,
    on_device: bool | None = None,
) -> torch.Tensor:
    """Agents' hidden states for `rows` as one zero-padded tensor [M, n, Hmax], on `device` (None: the host).

    Keeps float16 sources in float16 (the store's dtype: half the memory of a float32 copy);
    callers cast each gathered batch with `.float()`. `on_device` (None: on CUDA when the rows are at least
    half of every array, as a fit's training rows) gathers the rows where they go: each agent's whole
    array crosses once and index_select picks the rows there, so the host never builds the bank (at
    H = 4096 its largest copy in a fit: 12 x 902 x 4096 float32 = 177 MB, first-touch pages included);
    the same values either way. Otherwise (a chunk of a large scenario's rows, the host) the rows are
    gathered on the host.
    """
    rows = np.asarray(rows, dtype=np.int64)
    h_max = max(int(h.shape[1]) for h in hidden)
    half = all(np.dtype(getattr(h, "dtype", np.float32)) == np.float16 for h in hidden)
    dtype = np.float16 if half else np.float32
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if on_device is None:  # moving an array whole costs at most twice its rows' bytes
        on_device = dev.type == "cuda" and 2 * len(rows) >= max(int(h.shape[0]) for h in hidden)
    if on_device:
        t_dtype = torch.float16 if half else torch.float32
        out = torch.zeros(len(hidden), len(rows), h_max, dtype=t_dtype, device=dev)
        idx = torch.from_numpy(rows).to(dev)
        for i, h in enumerate(hidden):
            if len(rows):
                whole = torch.from_numpy(np.ascontiguousarray(h)).to(dev)  # [N, H_i]
                out[i, :, : h.shape[1]] = whole.index_select(0, idx)  # cast as astype would
        return out
    # filled through numpy: torch's CPU copy_ opens an OpenMP region per call (~12 ms each on a busy
    # 2-core host, 1000x numpy's copy of the same block)
    out = np.zeros((len(hidden), len(rows), h_max), dtype=dtype)  # host buffer
    for i, h in enumerate(hidden):
        if len(rows):
            out[i, :, : h.shape[1]] = np.asarray(h[rows])  # [n, H_i], cast as astype would
    return torch.from_numpy(out).to(dev)
