"""The hf backend's one-time checks, cached so a model load reads weights instead of re-checking.

- the self-check (HFBackend.self_check: our head path against the model's own forward) depends on the
  architecture, the weights, the dtype and the library versions, so a pass is cached per model identity
  (the fingerprint's: GGUF sha256, hub commit, local file hash), dtype, device kind, forward path and
  versions; a failure is never cached;
- the GEMM row-invariance probe of batch-invariant scoring (hf_packed.linear_rows_invariant: the decoder's
  linear layers up to 8,192 rows, the LM head up to the rows of its calls, HFBackend.head_rows: 682 for
  SmolLM2, 128 for Gemma-3's 262k vocabulary, whose head was ~80% of both probes' cost at a fixed 1,024)
  depends on the kernels only: cached per machine (the dtype probe's machine key), dtype, layer shapes and
  classes, and row counts;
- the packed-forward probe (probe_packed: random prompts alone, in two mixes and after a cached prefix, one
  attention call per layer, bit for bit) depends on the kernels and the model's shape: cached per machine,
  dtype, model class and attention shape, minimum rows and versions.

Both live as small JSON files under `$WALLA_CACHE/hf-checks/`; deleting the folder re-runs them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
import transformers
from walla.extract import dtype_probe
from walla.extract.backends.hf import _lm_head as lm_head
from walla.extract.backends.hf import _packed as hf_packed
from walla.extract.models import cache_root
from walla.store import atomic
from walla.store.fingerprint import canonical

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    return cache_root() / "hf-checks"


def _path(kind: str, key: dict, root: Path | None) -> Path:
    text = json.dumps(canonical({"check": kind, **key}), sort_keys=True)
    return (root or cache_dir()) / f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # absent or unreadable: check again


def _write(path: Path, value: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_json(path, value)
    except OSError as e:  # a read-only cache costs a re-check next time, nothing else
        log.warning("could not cache %s: %s", path, e)


def self_check_once(backend, model_identity: dict, root: Path | None = None) -> bool:
    """Run `backend.self_check()` unless this model passed it before here; returns True when cached.

    Raises:
        RuntimeError: the self-check fails (never cached).
    """
    key = {
        "model": model_identity,
        "class": type(backend.model).__name__,
        "dtype": str(backend.dtype),
        "device": backend.device.type,
        "packed": bool(backend.batch_invariant),
        **({"fixed_shapes": True} if backend.batch_invariant and backend.fixed_shapes else {}),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    path = _path("self-check", key, root)
    if _read(path) is not None:
        return True
    err = backend.self_check()
    _write(path, {"max_abs_error": err, **canonical(key)})
    return False


def rows_invariant(
    model,
    max_rows: int,
    root: Path | None = None,
    head_rows: int | None = None,
    vocab_chunk: int = lm_head.VOCAB_CHUNK,
) -> tuple[bool, int, str]:
    """hf_packed.linear_rows_invariant -> (invariant, min_rows, why), measured once per machine, dtype, layer
    shapes and row counts (the stream's `max_rows`, the LM head's calls' `head_rows`: HFBackend.head_rows)."""
    w = next(model.parameters())
    head = model.get_output_embeddings()
    if head_rows is None and head is not None:
        head_rows = lm_head.chunk_rows(int(head.weight.shape[0]), vocab_chunk=vocab_chunk)
    linears = [m for m in model.get_decoder().modules() if isinstance(m, torch.nn.Linear)]
    key = {
        "machine": dtype_probe.machine_key(str(w.device)),
        "dtype": str(w.dtype),
        "shapes": sorted({(m.in_features, m.out_features) for m in linears}),
        "head": list(head.weight.shape) if head is not None else None,
        "classes": sorted({f"{type(m).__module__}.{type(m).__qualname__}" for m in linears}),
        "max_rows": int(max_rows),
        "rows": list(hf_packed.PROBE_ROWS),
        "head_rows": head_rows,
        "vocab_chunk": vocab_chunk,
        "torch": torch.__version__,
    }
    path = _path("rows", key, root)
    hit = _read(path)
    if hit is not None and isinstance(hit.get("invariant"), bool) and isinstance(hit.get("min_rows"), int):
        return hit["invariant"], hit["min_rows"], f"{hit.get('why', '')} (cached in {path})"
    ok, min_rows, why = hf_packed.linear_rows_invariant(
        model, max_rows, head_rows=head_rows, vocab_chunk=vocab_chunk
    )
    _write(path, {"invariant": ok, "min_rows": min_rows, "why": why})
    return ok, min_rows, why


# prompt lengths of the packed-forward probe: a 1-token prompt, short ones, and each side of a key block edge
PROBE_LENGTHS = (1, 3, 17, 40, 63, 64, 65, 130)
PROBE_PREFIX = (
    100  # tokens of the probe's shared prefix: one whole key block (run once for all prompts) and part of one
)
# prompts of PROBE_LENGTHS the cached-prefix check also scores with the prefix as their own tokens (each a
# 100+ token forward through the LM head): after the 100-token prefix, which ends inside key block 1 (64-127),
# one stays in that block, one crosses into block 2 and one into block 3 (the cases of blocked_attention's
# per-prompt key blocks after a partly cached block); all eight still run after the cached prefix, in one pack
PREFIX_CHECK_LENGTHS = (1, 40, 130)
MIN_PROBE_LAYERS = 2  # decoder layers the packed probe runs at least (probe_depth)


def model_probe_key(backend) -> dict:
    """What a probe of a loaded backend's forward depends on besides its own constants: the machine, dtype,
    model class and shape, attention implementation, compile and library versions (the cache keys of
    packed_invariant and hf_fixed_probe.fixed_invariant)."""
    cfg = backend.model.config.get_text_config() if hasattr(backend.model.config, "get_text_config") else None
    cfg = cfg or backend.model.config
    return {
        "machine": dtype_probe.machine_key(backend.device.type),
        "dtype": str(backend.dtype),
        "class": type(backend.model).__name__,
        "shape": {k: getattr(cfg, k, None) for k in SHAPE_KEYS},
        "attention": getattr(cfg, "_attn_implementation", None),
        "compiled": bool(backend.compiled),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def cached_probe(
    kind: str, key: dict, root: Path | None, probe: Callable[[], tuple[bool, str]]
) -> tuple[bool, str]:
    """(ok, why) of `probe()`, run once per `key` and remembered under the checks' cache (a pass or a failure)."""
    path = _path(kind, key, root)
    hit = _read(path)
    if hit is not None and isinstance(hit.get("invariant"), bool):
        return hit["invariant"], f"{hit.get('why', '')} (cached in {path})"
    ok, why = probe()
    _write(path, {"invariant": ok, "why": why})
    return ok, why


def packed_invariant(backend, root: Path | None = None) -> tuple[bool, str]:
    """hf_packed's one-attention-call-per-layer path gives each prompt the same bits in any mix and after a
    cached prefix: probed once per machine, dtype, model shape, versions and minimum rows (probe_packed)."""
    key = {
        **model_probe_key(backend),
        "min_rows": int(backend.min_rows),
        "key_block": hf_packed.KEY_BLOCK,
        "attention_version": hf_packed.ATTENTION_VERSION,
        "lengths": list(PROBE_LENGTHS),
        "prefix": PROBE_PREFIX,
        "prefix_check": list(PREFIX_CHECK_LENGTHS),
        "layers": probe_depth(backend),
    }
    return cached_probe("packed", key, root, lambda: probe_packed(backend))


SHAPE_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "sliding_window",
    "attn_logit_softcapping",
    "vocab_size",
)


def probe_depth(backend) -> int:
    """Decoder layers the packed probe runs: the first layers up to one of every layer type the config names
    (`layer_types`: e.g. Gemma-3's sliding and full attention), at least MIN_PROBE_LAYERS.

    Why that proves what all layers would: whether a row's bits depend on its batch mates is a property of the
    kernels at the shapes they run (reduction order, blocking, which kernel is picked), not of the values; every
    layer of a type runs the same code at the same shapes, so a kernel that mixes rows in any layer mixes them
    in the first layer of its type, and the probe sees it at that layer's output (it compares the same truncated
    model with itself). Two layers at least: a layer's input is then another layer's output, as in the model.
    The final norm and the LM head run as always. SmolLM2-135M: 2 of 30 layers.
    """
    cfg = backend.decoder.config
    total = int(getattr(cfg, "num_hidden_layers", 0) or 0)
    types = list(getattr(cfg, "layer_types", None) or [])
    depth = max([MIN_PROBE_LAYERS, *(types.index(t) + 1 for t in set(types))])
    return min(depth, total) if total else depth


@contextlib.contextmanager
def first_layers(backend, depth: int) -> Iterator[set[int]]:
    """Run only the decoder's first `depth` layers inside (transformers' decoders loop over
    `layers[: config.num_hidden_layers]`); yields the set of layer indices that ran, so the caller reports what
    it checked even where an architecture loops otherwise (then every layer runs: slower, never weaker)."""
    cfg, layers = backend.decoder.config, getattr(backend.decoder, "layers", None)
    ran: set[int] = set()
    hooks = [
        layer.register_forward_pre_hook(lambda _m, _a, i=i: ran.add(i))
        for i, layer in enumerate(layers or [])
    ]
    total = cfg.num_hidden_layers
    cfg.num_hidden_layers = depth
    try:
        yield ran
    finally:
        cfg.num_hidden_layers = total
        for h in hooks:
            h.remove()


@torch.inference_mode()
def probe_packed(backend) -> tuple[bool, str]:
    """Random prompts (PROBE_LENGTHS tokens) scored alone, packed together, packed in reverse among another,
    and after a cached shared prefix (those of PREFIX_CHECK_LENGTHS vs with the prefix as their own tokens),
    all with one attention call per layer: every output (option log-probs, hidden state, NLL) must be the same
    bits, through the decoder's first `probe_depth` layers (its docstring: why that is as strong as all of
    them). Returns (ok, why)."""
    total = backend.decoder.config.num_hidden_layers
    with first_layers(backend, probe_depth(backend)) as ran:
        ok, why = _probe_packed(backend)
    return ok, f"{why}; {len(ran)} of {total} layers: one of each layer type (hf_checks.probe_depth)"


def _probe_packed(backend) -> tuple[bool, str]:
    gen = torch.Generator().manual_seed(0)
    vocab = int(backend.head.weight.shape[0])
    prompts = [torch.randint(vocab, (n,), generator=gen).tolist() for n in PROBE_LENGTHS]
    other = torch.randint(vocab, (50,), generator=gen).tolist()
    pre = torch.randint(vocab, (PROBE_PREFIX,), generator=gen).tolist()
    cand = torch.arange(min(8, vocab))
    before = backend.attention_batched
    backend.attention_batched = True
    try:
        alone = [backend.forward_packed([s], cand) for s in prompts]
        together = backend.forward_packed(prompts, cand)
        mixed = backend.forward_packed([other, *prompts[::-1]], cand)
        window = backend.sliding_window  # a cache of a sliding-window layer keeps the window only: no prefix
        longest = PROBE_PREFIX + max(PROBE_LENGTHS)
        cache_ok = not (window and longest > window)
        check = [i for i, n in enumerate(PROBE_LENGTHS) if n in PREFIX_CHECK_LENGTHS] if cache_ok else []
        full = {i: backend.forward_packed([pre + prompts[i]], cand) for i in check}
        cached = backend.forward_packed(prompts, cand, backend.run_prefix_packed(pre)) if cache_ok else None
    finally:
        backend.attention_batched = before
    n = len(prompts)
    checks = {
        "packed together": [tuple(f[i] for f in together) for i in range(n)],
        "packed in another mix": [tuple(f[n - i] for f in mixed) for i in range(n)],
    }
    for name, got in checks.items():
        for i, (a, b) in enumerate(zip(alone, got, strict=True)):
            if not all(np.array_equal(x[0], y) for x, y in zip(a, b, strict=True)):
                return False, _failed(name, PROBE_LENGTHS[i], backend)
    for i, f in full.items():
        if not all(np.array_equal(x[0], y[i]) for x, y in zip(f, cached, strict=True)):
            return False, _failed(f"after a cached {PROBE_PREFIX}-token prefix", PROBE_LENGTHS[i], backend)
    return True, (
        f"one attention call per layer: prompts of {', '.join(map(str, PROBE_LENGTHS))} tokens gave the same bits "
        f"alone and in two mixes, and those of {', '.join(map(str, PREFIX_CHECK_LENGTHS))} after a cached prefix "
        f"({backend.dtype}, {backend.device.type})"
    )


def _failed(where: str, length: int, backend) -> str:
    return (
        f"one attention call per layer changed a {length}-token prompt's bits {where} ({backend.dtype}, "
        f"{backend.device.type}): attention runs prompt by prompt, no prefix cache"
    )
