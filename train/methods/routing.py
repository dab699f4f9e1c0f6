"""What the three text routers (RouteLLM, RouterDC, NIRTRouter) share: config fields, inputs, fit, predict.

    class Config(RouterConfig): ...                     # each router's own defaults and extra keys
    states = fit_router(data, cfg, seeds, env, logs, make_head, loss_of, **fit_kwargs)
    out = router_predict(state, data, rows, env, make_head)

A router = a text encoder over the agents' prompts (walla.train.methods.encoders) + a head producing weight logits
[B, M]; weights = softmax(logits / temperature). AdamW over two parameter groups: the head at `lr`, the
encoder at `lr * encoder_lr_mult` (RouterDC's multiplier; 1 for RouteLLM and NIRT, as the paper fine-tunes
everything at one lr). `encoder_lr_mult: 0` freezes the encoder: its embeddings are computed once per
(encoder, text set) on env.device, cached in the store (walla.train.methods.embedding_cache) and reused across seeds
and methods; only the head trains. Gradients are clipped jointly over all trained parameters (`clip`).
Everything trains and predicts on env.device; heads are built there too (torch's RNG seeded per seed: on
the CPU the host init as before, on CUDA the device's generator, no host draw).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn
from walla.manifests.validate import build, check, config, to_dict
from walla.train.engine import TrainEnv, fit_module, init_device, row_batches, seeded, to_device
from walla.train.method_io import as_rows, pooled_output, scenario_tensors
from walla.train.methods import LogFn, MethodOutput
from walla.train.methods.embedding_cache import frozen_features
from walla.train.methods.encoders import POOLINGS, TRUNCATION_SIDES, EncoderSpec, TextEncoder, router_texts
from walla.train.pooling_losses import val_metric

FROZEN_CHUNK = 4096  # rows per forward pass at validation/predict with cached embeddings
FINETUNE_CHUNK = 64  # ... and through a trainable encoder


@config
class RouterConfig:
    """Fields every router reads (each router's `Config` subclasses this with its own defaults)."""

    with_context: bool = False  # encode each agent's own prompt, concatenated (SPEC §6: strip_context false)
    encoder: str = "bert-base-uncased"  # hub id, all-minilm-l6-v2 (offline), hashing, or a local directory
    pooling: str = "pooler"  # pooler (BERT) | cls (first token) | mean | none (hashing)
    max_len: int = 512  # tokens per prompt (SPEC §6: max_seq_length 512)
    normalize: bool = False  # L2-normalize the pooled embedding (MiniLM: true)
    truncation_side: str = "right"  # NIRT and RouterDC: left
    lr: float = 5e-5  # AdamW lr of the head (and of the encoder times encoder_lr_mult)
    encoder_lr_mult: float = 1.0  # encoder lr = lr * this; 0 freezes the encoder (cached embeddings)
    weight_decay: float = 0.01
    clip: float = 1.0  # joint gradient-norm clip over every trained parameter
    batch_size: int = 50
    epochs: int = 5
    patience: int = 5  # validation epochs without improvement
    reference_early_stopping: bool = False  # SPEC §10.2: all epochs, keep the last (soft targets: best KL)
    temperature: float = 2.0  # weights = softmax(logits / temperature)

    def __post_init__(self) -> None:
        check(self.pooling in POOLINGS, "pooling", f"one of {POOLINGS}", self.pooling)
        check(
            (self.encoder == "hashing") == (self.pooling == "none"),
            "pooling",
            "none exactly for the hashing encoder",
            self.pooling,
        )
        check(
            self.truncation_side in TRUNCATION_SIDES,
            "truncation_side",
            f"one of {TRUNCATION_SIDES}",
            self.truncation_side,
        )
        check(self.max_len >= 2, "max_len", ">= 2", self.max_len)
        for key in ("lr", "clip", "temperature"):
            check(getattr(self, key) > 0, key, "> 0", getattr(self, key))
        check(self.weight_decay >= 0, "weight_decay", ">= 0", self.weight_decay)
        check(
            self.encoder_lr_mult >= 0, "encoder_lr_mult", ">= 0 (0 freezes the encoder)", self.encoder_lr_mult
        )
        check(
            self.encoder != "hashing" or self.encoder_lr_mult == 0,
            "encoder_lr_mult",
            "0 with the hashing encoder (nothing to fine-tune)",
            self.encoder_lr_mult,
        )
        for key in ("batch_size", "epochs", "patience"):
            check(getattr(self, key) >= 1, key, ">= 1", getattr(self, key))


def encoder_spec(c: RouterConfig) -> EncoderSpec:
    return EncoderSpec(c.encoder, c.pooling, c.max_len, c.normalize, c.truncation_side)


class RouterNet(nn.Module):
    """Optional trainable encoder + head: cached embeddings [B, D_in] or text ids [B, T] -> logits [B, M]."""

    def __init__(self, head: nn.Module, encoder: TextEncoder | None = None):
        super().__init__()
        self.head, self.encoder = head, encoder

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = self.encoder(x) if self.encoder is not None else x  # [B, D_in]
        return self.head(feats)  # [B, M]


def router_input(data, c: RouterConfig, env: TrainEnv, encoder: TextEncoder | None = None):
    """The router's input: (x, encoder, D_in).

    Frozen: x = cached embeddings [N, T*D] on env.device, encoder None. Fine-tuning: x = text ids [N, T]
    (CPU index tensor) into a TextEncoder over the unique prompts (a new one, or ``encoder`` re-pointed
    at this scenario's texts).
    """
    spec = encoder_spec(c)
    if c.encoder_lr_mult == 0:
        feats = frozen_features(data, c.with_context, spec, env.store, env.device)  # [N, T*D]
        return torch.from_numpy(np.ascontiguousarray(feats)).to(env.device), None, int(feats.shape[1])
    texts, index = router_texts(data, c.with_context)
    if encoder is None:
        encoder = TextEncoder(spec, texts)
    else:
        encoder.set_texts(texts)
    return torch.from_numpy(index), encoder, encoder.dim * index.shape[1]


def _use_val(data, c: RouterConfig) -> bool:
    return len(data.split_index("val")) > 0 and (bool(data.soft_target) or not c.reference_early_stopping)


def _weights(net: nn.Module, x: torch.Tensor, rows: np.ndarray, c: RouterConfig, m: int) -> torch.Tensor:
    """softmax(net(x[rows]) / temperature), in chunks (small ones through a trainable encoder): [n, M]."""
    step = FROZEN_CHUNK if getattr(net, "encoder", None) is None else FINETUNE_CHUNK
    out = [net(x[to_device(rows[s : s + step], x.device)]) for s in range(0, len(rows), step)]  # [b, M]
    logits = torch.cat(out) if out else torch.zeros((0, m), device=x.device)
    return torch.softmax(logits / c.temperature, dim=-1)


def fit_router(
    data,
    c: RouterConfig,
    seeds: Sequence[int],
    env: TrainEnv,
    logs: Sequence[LogFn | None],
    make_head: Callable[[RouterConfig, int, int], nn.Module],
    loss_of: Callable[..., torch.Tensor | tuple],
    **fit_kwargs,
) -> list[dict]:
    """Train one router per seed on the train split (validation early stopping, SPEC §4.3).

    make_head(cfg, d_in, M) builds the head (under seeded(seed), on env.device); loss_of(module, logits [B, M], probs
    [B, M, K], target [B, K]) is the method's loss on a batch. Frozen embeddings are computed once for all
    seeds; with a trainable encoder each seed starts from its own copy of the pretrained one.
    """
    train_rows, val_rows = data.split_index("train"), data.split_index("val")
    if len(train_rows) == 0:
        raise ValueError(f"scenario {data.name!r} has no train rows to fit on")
    probs, target, _ = scenario_tensors(data, env.device)
    x, pristine, d_in = router_input(data, c, env)  # pristine: the pretrained encoder, copied per seed
    val_fn = None
    if _use_val(data, c):
        val_idx = to_device(val_rows, probs.device)
        vp, vt = probs[val_idx], target[val_idx]
        soft = bool(data.soft_target)

        def val_fn(module: nn.Module) -> float:
            return float(val_metric(_weights(module, x, val_rows, c, data.n_agents), vp, vt, soft))

    def loss_fn(module: nn.Module, rows: np.ndarray):
        idx = to_device(rows, probs.device)
        x_idx = idx if x.device == probs.device else torch.from_numpy(rows)  # text ids stay on the host
        return loss_of(module, module(x[x_idx]), probs[idx], target[idx])

    states = []
    for seed, log in zip(seeds, logs, strict=True):
        dev = init_device(env.device)
        with seeded(seed, dev), dev:  # torch.device as a context: the default device of the head's tensors
            head = make_head(c, d_in, data.n_agents)
        enc = copy.deepcopy(pristine) if pristine is not None else None
        net = RouterNet(head, enc)
        res = fit_module(
            net,
            loss_fn,
            row_batches(train_rows, c.batch_size, seed),
            env=env,
            val_fn=val_fn,
            optimizer="adamw",
            lr=c.lr,
            weight_decay=c.weight_decay,
            param_groups=_param_groups(net, c),
            epochs=c.epochs,
            patience=c.patience if val_fn is not None else None,
            clip=c.clip,
            clip_scope="all",
            seed=seed,
            log=log,
            **fit_kwargs,
        )
        states.append(
            {
                "config": to_dict(c),
                "params": {k: v.detach() for k, v in res.module.state_dict().items()},  # saved from the host
                "d_in": d_in,
                "n_agents": data.n_agents,
                "best_epoch": res.best_epoch,
                "epochs_run": res.epochs_run,
            }
        )
    return states


def _param_groups(net: RouterNet, c: RouterConfig) -> list[dict]:
    """AdamW groups: the head at lr, a trainable encoder at lr * encoder_lr_mult."""
    groups = [{"params": list(net.head.parameters()), "lr": c.lr}]
    if net.encoder is not None:
        groups.append({"params": list(net.encoder.parameters()), "lr": c.lr * c.encoder_lr_mult})
    return groups


def router_predict(
    state: dict,
    data,
    rows: np.ndarray,
    env: TrainEnv,
    cls: type,
    make_head: Callable[[RouterConfig, int, int], nn.Module],
) -> MethodOutput:
    """Weights softmax(logits / temperature) of a fitted router on ``rows`` (computed on env.device)."""
    c = build(cls, state["config"], "router state")
    rows = as_rows(rows, len(data.split))
    if data.n_agents != state["n_agents"]:
        raise ValueError(
            f"scenario {data.name!r} has {data.n_agents} agents, the router was fitted on {state['n_agents']}"
        )
    x, encoder, d_in = router_input(data, c, env)
    if d_in != state["d_in"]:
        raise ValueError(
            f"router input width {d_in} differs from the fitted {state['d_in']} (different encoder or agents)"
        )
    with init_device(env.device):  # built where it predicts; every value is loaded next
        head = make_head(c, d_in, data.n_agents)
    net = RouterNet(head, encoder)
    net.load_state_dict(state["params"])
    net.to(env.device).eval()
    with torch.no_grad():
        weights = _weights(net, x, rows, c, data.n_agents)  # [n, M]
    return pooled_output(data, rows, weights)
