"""Wager heads: one small MLP per agent on that agent's own last-layer hidden state (SPEC §5.1).

    WagerHead(in_dim)             one agent's head, a plain nn.Module: x [B, H] -> raw score r [B]
    StackedHeads(in_dims)         G independent heads evaluated as ONE module (batched matmuls):
                                  x [G, B, Hmax] -> r [G, B]; head g only ever touches slice g of
                                  every parameter, so per-slice gradients, Adam state and clipping
                                  are exactly those of G separately trained WagerHeads.

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
Initialization copies nn.Linear's default per head, with fan_in = the head's real H_i.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn


def _layer_dims(in_dim: int, hidden: Sequence[int], projection_dim: int | None) -> list[int]:
    dims = [in_dim] + ([projection_dim] if projection_dim else []) + list(hidden) + [1]
    return dims


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
        """`masks`: optional explicit dropout keep-masks (one [B, width] per hidden layer, values 0/1);
        without them nn.functional.dropout is used (train mode) or nothing (eval mode)."""
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


def _low_copy(scratch: dict, key: str, p: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
    """p in dtype `dt`, in a persistent buffer. Master mode (scratch["gw"] set): re-cast only when p changed
    through torch since the last cast (its version counter moved: load_rows, a torch optimizer); MasterAdam
    writes p and this copy together without touching the counter. Otherwise cast every call."""
    c = scratch.get(key)
    if c is None or c.dtype != dt or c.shape != p.shape:
        c = scratch[key] = torch.empty(p.shape, dtype=dt, device=p.device)
        scratch[key + "_v"] = None
    if "gw" not in scratch or scratch[key + "_v"] != p._version:
        c.copy_(p.detach())
        scratch[key + "_v"] = p._version
    return c


class _StackedAffine(torch.autograd.Function):
    """out = b + h @ w per head (h [G, B, a], w [G, a, c], b [G, c]) whose backward writes the weight and bias
    gradients INTO the parameters' persistent .grad tensors (torch.bmm(..., out=)) and returns None for them.

    Why: at the paper's width a stacked weight gradient is 0.5 GB; autograd allocates it fresh every step and
    the kernel zero-fills the new pages at ~1/3 of the memory bandwidth (measured: 2.3 vs 7.5 GB/s here),
    which made the weight-gradient GEMM ~1.8x slower than the same GEMM into an existing buffer.
    In float32 the kernels are the ones autograd's BaddbmmBackward runs (bmm(h^T, dout), dout.sum(1),
    bmm(dout, w^T)), so results are identical. Under autocast (bf16-mixed) the weight is cast into a
    persistent low-precision copy, the GEMMs run in that dtype (as autocast's baddbmm would) and the weight
    gradient is converted into the float32 .grad through a persistent scratch buffer. In master mode
    (StackedHeads.enable_masters, for mixed_adam.MasterAdam) the working copy is the one the optimizer wrote
    and the gradients stay in the bf16 buffers: no cast pass and no conversion pass.
    """

    @staticmethod
    def forward(ctx, h: torch.Tensor, w: torch.Tensor, b: torch.Tensor, scratch: dict) -> torch.Tensor:
        kind = h.device.type
        dt = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else w.dtype
        with torch.autocast(kind, enabled=False):
            if dt != w.dtype:
                wc, bc, h = _low_copy(scratch, "w", w, dt), _low_copy(scratch, "b", b, dt), h.to(dt)
            else:
                wc, bc = w, b
            out = torch.baddbmm(bc.unsqueeze(1), h, wc)  # [G, B, c]
        if "gw" in scratch:  # master mode: the bf16 gradients MasterAdam reads
            ctx.grads = (scratch["gw"], scratch["gb"])
        else:
            for p in (w, b):
                if p.grad is None or p.grad.shape != p.shape:
                    p.grad = torch.empty_like(p)  # fully overwritten by backward
            ctx.grads = (w.grad, b.grad)
        ctx.save_for_backward(h, wc)
        ctx.scratch = scratch
        return out

    @staticmethod
    def backward(ctx, dout: torch.Tensor):
        h, wc = ctx.saved_tensors
        gw, gb = ctx.grads
        dout = dout.to(wc.dtype)
        with torch.autocast(dout.device.type, enabled=False):
            if gw.dtype == wc.dtype:
                torch.bmm(h.transpose(1, 2), dout, out=gw)  # [G, a, c]
            else:
                gs = ctx.scratch.get("g")
                if gs is None or gs.dtype != wc.dtype or gs.shape != wc.shape:
                    gs = ctx.scratch["g"] = torch.empty_like(wc)
                torch.bmm(h.transpose(1, 2), dout, out=gs)
                gw.copy_(gs)
            gb.copy_(dout.sum(1))  # [G, c]
            dh = torch.bmm(dout, wc.transpose(1, 2)) if ctx.needs_input_grad[0] else None
        return dh, None, None, None


class StackedHeads(nn.Module):
    """G independent WagerHeads as stacked parameters: weights[j] [G, d_j, d_j+1], biases[j] [G, d_j+1].

    Head g only ever touches slice g of every parameter; Adam is elementwise, so slice g's update is
    exactly that of head g trained alone (with per-head clipping, `clip_per_head_`).
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
        self._scratch: dict[int, dict] = {}  # per layer: low-precision weight copy and gradient (write_grads)
        self.master = False  # master mode (enable_masters)
        self.grad_coef: torch.Tensor | None = None  # master mode: per-head clip coefficients [G]
        if init:
            for i, d in enumerate(self.in_dims):
                self.load_head(i, WagerHead(d, hidden, dropout, projection_dim))

    @property
    def n_heads(self) -> int:
        return len(self.in_dims)

    @torch.no_grad()
    def load_head(self, g: int, head: WagerHead) -> None:
        """Copy a WagerHead's parameters into slice g (zero-padding input rows beyond its H_g)."""
        for j, layer in enumerate(head.layers):
            w = layer.weight.detach().T  # [d_in, d_out]
            self.weights[j][g, : w.shape[0]] = w
            self.weights[j][g, w.shape[0] :].zero_()  # padding rows only
            self.biases[j][g] = layer.bias.detach()

    @torch.no_grad()
    def head(self, g: int) -> WagerHead:
        """Slice g as a plain WagerHead (same function; for inspection and tests)."""
        out = WagerHead(self.in_dims[g], self.hidden, self.dropout, self.projection_dim)
        for j, layer in enumerate(out.layers):
            layer.weight.copy_(self.weights[j][g, : layer.in_features].T)
            layer.bias.copy_(self.biases[j][g])
        return out

    def state_rows(self, rows: slice) -> list[torch.Tensor]:
        """Detached copies of the parameters of heads `rows` (weights then biases)."""
        return [p.detach()[rows].clone() for p in self.parameters()]

    @torch.no_grad()
    def load_rows(self, rows: slice, values: Sequence[torch.Tensor]) -> None:
        for p, v in zip(self.parameters(), values, strict=True):
            p[rows] = v

    def forward(
        self, x: torch.Tensor, masks: Sequence[torch.Tensor] | None = None, write_grads: bool = False
    ) -> torch.Tensor:
        """x [G, B, Hmax] (zero-padded) -> raw scores r [G, B].

        `masks`: explicit dropout keep-masks, one [G, B, width] per hidden layer (0/1 floats); None means
        no dropout (eval). Explicit masks let callers draw them from per-seed generators.
        `write_grads`: the backward pass OVERWRITES each parameter's persistent .grad in place (allocated
        once; never accumulated, so no zero_grad is needed) instead of autograd allocating fresh gradients
        (see _StackedAffine). Same numbers in float32; under autocast the GEMMs run in the autocast dtype.
        """
        h = x  # [G, B, Hmax]
        last = len(self.weights) - 1
        fast = write_grads and torch.is_grad_enabled()
        for j, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            if fast:
                h = _StackedAffine.apply(h, w, b, self._scratch.setdefault(j, {}))  # [G, B, d_j+1]
            else:
                h = torch.baddbmm(b.unsqueeze(1), h, w)  # [G, B, d_j+1]
            if j < self.n_proj or j == last:
                continue
            h = torch.relu(h)
            if masks is not None:
                h = h * masks[j - self.n_proj].to(h.dtype) * (1.0 / (1.0 - self.dropout))  # [G, B, d_j+1]
        return h.squeeze(-1)  # [G, B]

    @torch.no_grad()
    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Eval-mode forward (no dropout) of x [G, n, Hmax] -> r [G, n], the projection folded into the first
        layer when that is cheaper (n > H D / (H + D); see module docstring). Same function up to rounding."""
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

    @torch.no_grad()
    def enable_masters(self, dtype: torch.dtype) -> dict[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Master mode: the float32 parameters are masters; write_grads forwards read persistent `dtype` working
        copies and backwards write `dtype` gradients (no .grad); clip_per_head_ only records the clip
        coefficients (grad_coef) and the optimizer applies them. Returns {parameter: (working copy, gradient)}.
        """
        out, self.master = {}, True
        for j, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            sc = self._scratch.setdefault(j, {})
            sc["gw"], sc["gb"] = (torch.zeros(p.shape, dtype=dtype, device=p.device) for p in (w, b))
            out[w], out[b] = (
                (_low_copy(sc, "w", w, dtype), sc["gw"]),
                (_low_copy(sc, "b", b, dtype), sc["gb"]),
            )
        return out

    def _grads(self) -> list[torch.Tensor]:
        if self.master:
            return [self._scratch[j][k] for k in ("gw", "gb") for j in range(len(self.weights))]
        return [p.grad for p in self.parameters() if p.grad is not None]

    @torch.no_grad()
    def clip_per_head_(self, max_norm: float) -> torch.Tensor:
        """Clip each head's gradient norm (over all its parameters) to max_norm exactly like
        torch.nn.utils.clip_grad_norm_ on that head alone (coef = max_norm / (norm + 1e-6), capped at 1).
        Returns the pre-clip norms [G]. Master mode: the coefficients go to grad_coef for the optimizer."""
        grads = self._grads()
        if not grads:
            return torch.zeros(self.n_heads, device=self.weights[0].device)
        if self.master:  # bf16 gradients: one read each, float accumulation (mixed_adam.sq_norms)
            from walla.train.mixed_adam import sq_norms

            norm = sq_norms(grads).sqrt().float()  # [G]
        else:
            norm = sum(torch.linalg.vector_norm(g.reshape(g.shape[0], -1), dim=1) ** 2 for g in grads).sqrt()
        coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)  # [G]
        if self.master:
            self.grad_coef = coef
        elif bool((coef < 1.0).any()):  # x * 1.0 == x: skip a read+write of every gradient when none clips
            for g in grads:
                g.mul_(coef.view(-1, *([1] * (g.dim() - 1))))
        return norm


def stack_hidden(hidden: Sequence, rows: np.ndarray) -> torch.Tensor:
    """Agents' hidden states for `rows` as one zero-padded tensor [M, n, Hmax].

    Keeps float16 sources in float16 (the store's dtype: half the memory of a float32 copy);
    callers cast each gathered batch with `.float()`.
    """
    rows = np.asarray(rows, dtype=np.int64)
    h_max = max(int(h.shape[1]) for h in hidden)
    half = all(np.dtype(getattr(h, "dtype", np.float32)) == np.float16 for h in hidden)
    dtype = torch.float16 if half else torch.float32
    out = torch.zeros(len(hidden), len(rows), h_max, dtype=dtype, device="cpu")  # host buffer
    for i, h in enumerate(hidden):
        block = np.asarray(h[rows] if len(rows) else np.zeros((0, h.shape[1])))
        out[i, :, : block.shape[1]] = torch.from_numpy(
            block.astype(np.float16 if half else np.float32, copy=False)
        )
    return out
