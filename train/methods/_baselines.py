"""Plain helpers shared by the baseline modules (no base class, STYLE item 6).

- ``build_config``: a method's frozen config dataclass from its resolved cfg dict (unknown key -> ValueError).
- ``pooled_output``: weights -> linear pool -> MethodOutput, respecting ``option_mask``.
- ``mixture_ce`` / ``val_metric``: the baselines' training loss and validation criterion (SPEC §4.3, §6).
- ``fit_weight_model``: train a weight-producing module through ``walla.train.lit.fit_module`` with real
  validation early stopping, or the reference behaviour (SPEC §10.2) when asked.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn
from walla.train.lit import FitResult, fit_module, row_batches
from walla.train.mechanism import brier_loss, pool
from walla.train.methods import MethodOutput

LOG_EPS = 1e-10  # inside the mixture cross-entropy and KL (SPEC §6, §8)


# ------------------------------------------------------------------------------------------- config


def _coerce(value: object, typ: object, where: str) -> object:
    """Check/convert one cfg value against a dataclass field type (YAML gives '5e-7' as str, §10.21)."""
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(typ)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, where)
            except ValueError as e:
                errors.append(str(e))
        raise ValueError(errors[0] if errors else f"{where}: bad value {value!r}")
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ValueError(f"{where}: expected a list, got {value!r}")
        inner = typing.get_args(typ)[0]
        return tuple(_coerce(v, inner, where) for v in value)
    if typ is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where}: expected true/false, got {value!r}")
        return value
    if typ is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}: expected an integer, got {value!r}")
        return value
    if typ is float:
        if isinstance(value, bool):
            raise ValueError(f"{where}: expected a number, got {value!r}")
        try:
            return float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ValueError(f"{where}: expected a number, got {value!r}") from None
    if typ is str:
        if not isinstance(value, str):
            raise ValueError(f"{where}: expected a string, got {value!r}")
        return value
    return value


def build_config(cls: type, cfg: dict | None, method: str):
    """Instantiate config dataclass ``cls`` from ``cfg`` (SPEC defaults for missing keys).

    Raises:
        ValueError: an unknown key (with the allowed ones) or a value of the wrong type.
    """
    cfg = dict(cfg or {})
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(cfg) - set(names))
    if unknown:
        raise ValueError(
            f"{method}: unknown config key {unknown[0]!r} (allowed: {', '.join(names) or 'none'})"
        )
    kwargs = {k: _coerce(v, hints[k], f"{method}: config key {k!r}") for k, v in cfg.items()}
    out = cls(**kwargs)
    check = getattr(out, "check", None)
    if check is not None:
        check(method)
    return out


def resolved_dict(cls: type, cfg: dict | None, method: str) -> dict:
    """Every hyper-parameter with defaults filled in (what run.json records): JSON-ready."""
    out = dataclasses.asdict(build_config(cls, cfg, method))
    return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}


def check_common(c, method: str) -> None:
    """Range checks for the training keys most configs share."""
    for key in ("lr", "encoder_lr", "clip", "temperature"):
        v = getattr(c, key, None)
        if v is not None and not v > 0:
            raise ValueError(f"{method}: config key {key!r} must be > 0, got {v!r}")
    for key in ("epochs", "batch_size", "patience"):
        v = getattr(c, key, None)
        if v is not None and v < 1:
            raise ValueError(f"{method}: config key {key!r} must be >= 1, got {v!r}")
    d = getattr(c, "dropout", None)
    if d is not None and not 0.0 <= d < 1.0:
        raise ValueError(f"{method}: config key 'dropout' must be in [0, 1), got {d!r}")
    mode = getattr(c, "encoder_mode", None)
    if mode is not None and mode not in ("frozen", "finetune"):
        raise ValueError(f"{method}: config key 'encoder_mode' must be frozen or finetune, got {mode!r}")
    engine = getattr(c, "engine", None)
    if engine is not None and engine not in ("lightning", "loop"):
        raise ValueError(f"{method}: config key 'engine' must be lightning or loop, got {engine!r}")


# ------------------------------------------------------------------------------------------- arrays


def scenario_tensors(data) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(probs [N, M, K], target [N, K], option_mask [N, K] bool) as torch tensors (float32)."""
    probs = torch.as_tensor(np.asarray(data.probs, dtype=np.float32))
    target = torch.as_tensor(np.asarray(data.target, dtype=np.float32))
    mask = torch.as_tensor(np.asarray(data.option_mask, dtype=bool))
    return probs, target, mask


def as_rows(rows: np.ndarray, n: int) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    if rows.size and (rows.min() < 0 or rows.max() >= n):
        raise ValueError(
            f"rows must index the scenario's {n} questions, got range [{rows.min()}, {rows.max()}]"
        )
    return rows


def pooled_output(data, rows: np.ndarray, weights: torch.Tensor, extras: dict | None = None) -> MethodOutput:
    """Linear pool of the agents' probs on ``rows`` with ``weights [n, M]`` -> MethodOutput (float32)."""
    probs = torch.as_tensor(np.asarray(data.probs[rows], dtype=np.float32))  # [n, M, K]
    mask = torch.as_tensor(np.asarray(data.option_mask[rows], dtype=bool))  # [n, K]
    w = weights.detach().to(torch.float32)
    w = w / w.sum(-1, keepdim=True)  # [n, M] rows sum to 1
    agg = pool(probs, w, kind="linear", option_mask=mask)  # [n, K], 0 on absent options
    return MethodOutput(
        weights=w.numpy().astype(np.float32), agg_probs=agg.numpy().astype(np.float32), extras=extras or {}
    )


def store_dir(explicit: str | None, data) -> Path | None:
    """Embedding cache root: the cfg's ``embedding_cache``, else the store the scenario came from."""
    if explicit:
        return Path(explicit)
    store = (data.meta or {}).get("store")
    return Path(store) if store else None


# ------------------------------------------------------------------------------------------- losses


def mixture_ce(weights: torch.Tensor, probs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """-mean_b sum_k q_bk log(p_agg,bk + 1e-10), p_agg the linear pool (SPEC §6; q soft for BayesX).

    weights [B, M] (rows sum to 1), probs [B, M, K] (0 on absent options), target [B, K].
    """
    agg = (weights.unsqueeze(-1) * probs).sum(-2)  # [B, K]
    agg = agg / agg.sum(-1, keepdim=True).clamp_min(LOG_EPS)
    return -(target * torch.log(agg + LOG_EPS)).sum(-1).mean()


def val_metric(weights: torch.Tensor, probs: torch.Tensor, target: torch.Tensor, soft: bool) -> float:
    """Validation criterion, lower is better: mean KL(q || p_agg) for soft targets, else Brier D-regret.

    D-regret = mean_b [Brier(p_agg) - min_i Brier(p_i)] (unhalved Brier, SPEC §8).
    """
    agg = (weights.unsqueeze(-1) * probs).sum(-2)  # [B, K]
    agg = agg / agg.sum(-1, keepdim=True).clamp_min(LOG_EPS)
    if soft:
        kl = (target * (torch.log(target + LOG_EPS) - torch.log(agg.clamp_min(LOG_EPS)))).sum(-1)  # [B]
        return float(kl.mean())
    agg_brier = brier_loss(agg, target)  # [B]
    best = brier_loss(probs, target.unsqueeze(-2)).min(-1).values  # [B]
    return float((agg_brier - best).mean())


# ------------------------------------------------------------------------------------------- training


def fit_weight_model(
    net: nn.Module,
    data,
    loss_fn: Callable[[nn.Module, np.ndarray], torch.Tensor | tuple[torch.Tensor, dict]],
    weights_fn: Callable[[nn.Module, np.ndarray], torch.Tensor],
    c,
    seed: int,
    log=None,
    param_groups: list[dict] | None = None,
    optimizer: str = "adam",
    skip_grad_norm_above: float | None = None,
    val_chunk: int = 4096,
) -> FitResult:
    """Train ``net`` on the train split with per-epoch validation early stopping (SPEC §4.3, §10.2).

    Default: the validation criterion (val KL for soft targets, val Brier D-regret otherwise) is tracked
    every epoch; training stops after ``c.patience`` epochs without improvement and the best state is
    restored. ``c.reference_early_stopping``: the reference's behaviour -- all ``c.epochs``, last state
    kept, except soft-target datasets, where it did select the best epoch by validation KL.
    Validation weights are computed ``val_chunk`` rows at a time (small for a fine-tuned encoder).
    """
    train_rows = data.split_index("train")
    val_rows = data.split_index("val")
    if len(train_rows) == 0:
        raise ValueError(f"scenario {data.name!r} has no train rows to fit on")
    probs, target, _ = scenario_tensors(data)
    use_val = len(val_rows) > 0 and (data.soft_target or not c.reference_early_stopping)
    val_fn = None
    if use_val:
        vp, vt = probs[val_rows], target[val_rows]

        def val_fn(module: nn.Module) -> float:
            chunks = [
                weights_fn(module, val_rows[s : s + val_chunk]) for s in range(0, len(val_rows), val_chunk)
            ]
            return val_metric(torch.cat(chunks), vp, vt, bool(data.soft_target))  # weights [n_val, M]

    return fit_module(
        net,
        loss_fn,
        row_batches(train_rows, c.batch_size, seed),
        val_fn=val_fn,
        optimizer=optimizer,
        lr=c.lr,
        weight_decay=getattr(c, "weight_decay", 0.0),
        param_groups=param_groups,
        epochs=c.epochs,
        patience=c.patience if use_val else None,
        clip=c.clip,
        skip_grad_norm_above=skip_grad_norm_above,
        seed=seed,
        log=log,
        logger=None,
        engine=c.engine,
    )


# ------------------------------------------------------------------------------------------- routers


class RouterNet(nn.Module):
    """Text router = optional trainable encoder (finetune mode) + a head producing weight logits [B, M].

    Frozen mode feeds cached embeddings [B, D_in] straight to the head; finetune mode feeds text ids
    [B, T] through ``encoder`` (walla.train.encoders.TextEncoder) first.
    """

    def __init__(self, head: nn.Module, encoder: nn.Module | None = None):
        super().__init__()
        self.head, self.encoder = head, encoder

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = self.encoder(x) if self.encoder is not None else x  # [B, D_in]
        return self.head(feats)  # [B, M]


def router_input(data, c, method: str, encoder: nn.Module | None = None):
    """Router inputs for every question: (x [N, D_in] float32 | text ids [N, T] int64, encoder, D_in).

    Frozen mode: cached embeddings (walla.train.encoders). Finetune mode: a TextEncoder over the
    scenario's unique texts (or ``encoder`` re-pointed at this scenario's texts, for predict).
    """
    from walla.train.encoders import TextEncoder, encoder_spec, frozen_features, router_texts

    spec = encoder_spec(c.encoder, c.pooling, c.max_len, truncation_side=c.truncation_side)
    if c.encoder_mode == "frozen":
        feats = frozen_features(data, c.with_context, spec, store_dir(c.embedding_cache, data))  # [N, T*D]
        return torch.from_numpy(np.ascontiguousarray(feats)), None, int(feats.shape[1])
    texts, index = router_texts(data, c.with_context)
    if encoder is None:
        encoder = TextEncoder(spec, texts)
    else:
        encoder.set_texts(texts)
    return torch.from_numpy(index), encoder, encoder.dim * index.shape[1]


def router_param_groups(net: RouterNet, c) -> list[dict]:
    """Head at ``lr``; the encoder (finetune mode) at ``encoder_lr``; grads clipped per group."""
    groups = [{"params": [p for p in net.head.parameters() if p.requires_grad], "lr": c.lr}]
    if net.encoder is not None:
        groups.append(
            {"params": [p for p in net.encoder.parameters() if p.requires_grad], "lr": c.encoder_lr}
        )
    return groups


def fit_router(net, data, loss_fn, weights_fn, c, seed: int, log, encoder, d_in: int, **fit_kwargs) -> dict:
    """The routers' shared training tail: AdamW over their param groups, then the state predict() reads.

    Validation runs in small chunks when gradients go through a text encoder (finetune mode)."""
    res = fit_weight_model(
        net,
        data,
        loss_fn,
        weights_fn,
        c,
        seed,
        log,
        param_groups=router_param_groups(net, c),
        val_chunk=4096 if encoder is None else 64,
        optimizer="adamw",
        **fit_kwargs,
    )
    return {
        "config": c,
        "net": res.module,
        "d_in": d_in,
        "best_epoch": res.best_epoch,
        "epochs_run": res.epochs_run,
    }


def router_predict(state: dict, data, rows: np.ndarray, method: str) -> MethodOutput:
    """Weights softmax(logits / temperature) of a fitted router on ``rows``, pooled linearly."""
    c, net = state["config"], state["net"]
    rows = as_rows(rows, len(data.split))
    x, _, d_in = router_input(data, c, method, encoder=net.encoder)
    if d_in != state["d_in"]:
        raise ValueError(
            f"{method}: router input width {d_in} differs from the fitted {state['d_in']} "
            "(different encoder or agent count)"
        )
    net.eval()
    step = 4096 if net.encoder is None else 64
    out = []
    with torch.no_grad():
        for s in range(0, len(rows), step):
            idx = torch.from_numpy(rows[s : s + step])
            out.append(torch.softmax(net(x[idx]) / c.temperature, dim=-1))  # [b, M]
    weights = torch.cat(out) if out else torch.zeros((0, data.n_agents))
    return pooled_output(data, rows, weights)
