"""Loading a model for the hf backend: weights and tokenizer onto the device (`load_model`), then the backend
built around them with the checks it rests on, timed (`load_hf_backend`: self-check, invariance probes,
compiling).

GGUF files (the embedded models) load from their safetensors copy in the walla cache
(extract/models/_gguf.py, shared with the vllm backend). The attention implementation is
transformers' own choice (SDPA where the architecture supports it, else eager).
"""

from __future__ import annotations

import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from walla.extract import device as devices
from walla.extract.backends.hf import _compile as hf_compile
from walla.extract.backends.hf import _lm_head as lm_head
from walla.extract.backends.hf import _probes as hf_checks
from walla.extract.backends.hf._backend import HFBackend
from walla.extract.backends.hf._modes import resolve_dtype
from walla.extract.models import ResolvedModel, cache_root, local_weights_dir, quiet_transformers
from walla.extract.models import _hub as hub


def load_model(rm: ResolvedModel, dtype: torch.dtype, device: str, times: dict | None = None):
    """(model, tokenizer) for a resolved model; hub failures become one-line HubUnavailableError.

    The weights are read straight onto the device in `dtype` (device_map): no float32 copy on the host,
    no second copy to the GPU. `times` gets the seconds of the tokenizer and the weights.
    """
    times = {} if times is None else times
    kwargs: dict = {"trust_remote_code": rm.trust_remote_code}
    is_hub = rm.identity.get("source") == "hub"
    src = local_weights_dir(rm)
    if is_hub:
        if rm.gguf_file:
            kwargs["gguf_file"] = rm.gguf_file
        if rm.revision:
            kwargs["revision"] = rm.revision
    why = hub.prepare_hub_access() if is_hub else ""
    placement = {} if device == "cpu" else {"device_map": device}  # cpu: as before (no accelerate dispatch)
    try:
        with quiet_transformers():
            t = time.perf_counter()
            tok = AutoTokenizer.from_pretrained(src, **kwargs)
            times["tokenizer"] = time.perf_counter() - t
            # no attn_implementation: transformers picks SDPA where the architecture has it, else eager
            # (forcing "sdpa" made e.g. Gemma-2 refuse to load with a message that never says "sdpa")
            t = time.perf_counter()
            model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype, **placement, **kwargs)
            model = model.to(device).eval()  # a no-op where device_map placed it
            times["weights"] = time.perf_counter() - t
    except (OSError, ValueError, RuntimeError) as e:
        if not is_hub or isinstance(e, hub.HubUnavailableError):
            raise
        reason = (why + " and it is not in the local cache") if why else hub.describe_failure(e)
        raise hub.unavailable("model", rm.load_from, reason, hub.EMBEDDED_HINT) from e
    return model, tok


def load_hf_backend(
    rm: ResolvedModel,
    *,
    dtype: str = "auto",
    device: str | None = None,
    batch_tokens: int = 4096,
    chat_template: bool = False,
    compiled: bool = False,
    batch_invariant: bool | None = None,
    shard_rows: int | None = None,
    fixed_shapes: bool | None = None,
    max_batch_rows: int | None = None,
) -> HFBackend:
    """Load a resolved model and wrap it; runs the self-check (once per model and machine: cached), then
    compiles when `compiled`. `backend.load_times` says where the seconds went."""
    device = device or devices.default_device()
    times: dict[str, float] = {}
    t = time.perf_counter()
    torch_dtype = resolve_dtype(dtype, device)  # measured once per machine, then read from its cache
    times["dtype"] = time.perf_counter() - t
    model, tok = load_model(rm, torch_dtype, device, times)
    cuda = device.startswith("cuda")
    backend = HFBackend(
        model,
        tok,
        batch_tokens=batch_tokens,
        chat_template=chat_template,
        identity={"model": rm.identity},
        chunk_elems=lm_head.CHUNK_ELEMS_CUDA if cuda else lm_head.CHUNK_ELEMS,
        batch_invariant=batch_invariant,
        shard_rows=shard_rows,
        fixed_shapes=fixed_shapes,
        max_batch_rows=max_batch_rows,
    )
    if rm.hidden_size and rm.hidden_size != backend.hidden_size:
        raise ValueError(
            f"model {rm.name!r}: manifest hidden_size {rm.hidden_size} but the loaded model has "
            f"{backend.hidden_size}; fix manifests/models.yaml"
        )
    probe_late = backend.probe_after_compile(compiled)
    if backend.batch_invariant and not probe_late:  # the probes invariant scoring rests on (cached): timed
        t = time.perf_counter()
        backend.settle_invariance()
        times["invariance probes"] = time.perf_counter() - t
    t = time.perf_counter()
    cached = hf_checks.self_check_once(backend, rm.identity)  # eager, before compiling: the architecture
    times["self-check (cached)" if cached else "self-check"] = time.perf_counter() - t
    if compiled:
        t = time.perf_counter()
        hf_compile.use_compile_cache(
            hf_compile.compile_cache_dir(rm.identity, str(torch_dtype), device, cache_root())
        )
        before = hf_compile.cache_counts()
        backend.compile()
        cached = hf_compile.served_from_cache(before, hf_compile.cache_counts())
        times["compile (cached)" if cached else "compile"] = time.perf_counter() - t
    if probe_late:  # on the compiled forward that will run (probe_after_compile)
        t = time.perf_counter()
        backend.settle_invariance()
        times["invariance probes (compiled)"] = time.perf_counter() - t
    backend.load_times = times
    return backend
