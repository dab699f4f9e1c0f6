"""The `hf` backend kind: how walla-extract settles, fingerprints and loads a transformers model.

The scoring itself is extract/backends/hf.py; this is the registry's view of it. `--dtype auto` is
measured once per machine (extract/dtype_probe.py), `--compile auto` follows the device and the job's size
(extract/backends/hf_compile.py), `--batch-invariant auto` the dtype and device (hf.py), and
`--batch-tokens` / `--shard-rows auto` the device's free memory and the model's shape (extract/sizing.py),
all BEFORE the fingerprint is computed, so the fingerprint records what the model actually runs with.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch
from transformers import AutoConfig
from walla.extract import device as devices
from walla.extract import sizing
from walla.extract.backends import BATCHING_KEY, BackendRequest, lm_head
from walla.extract.backends.hf import (
    HFBackend,
    batching_identity,
    explain_batch_invariant,
    explain_dtype,
    hf_identity,
    load_hf_backend,
    resolve_dtype,
)
from walla.extract.backends.hf_compile import explain_compile
from walla.extract.gguf_cache import local_weights_dir, quiet_transformers
from walla.extract.models import ResolvedModel, pin_revision


def model_shape(rm: ResolvedModel, dtype: str) -> sizing.ModelShape:
    """The model's shape from its config alone (no weights read).

    Raises:
        OSError, ValueError: the config cannot be read, or lacks a field the sizing needs.
    """
    kwargs: dict = {"trust_remote_code": rm.trust_remote_code}
    if rm.identity.get("source") == "hub":
        kwargs |= {k: v for k, v in (("gguf_file", rm.gguf_file), ("revision", rm.revision)) if v}
    with quiet_transformers():
        config = AutoConfig.from_pretrained(local_weights_dir(rm), **kwargs)
    return sizing.ModelShape.from_config(config, dtype)


def scoring_fixed_bytes(shape: sizing.ModelShape) -> int:
    """Device bytes of the scoring path that do not grow with the batch: the last-position head's
    HEAD_ROWS x V logits (model dtype + float32 + log-softmax) and one prompt-NLL chunk of logits."""
    head = lm_head.HEAD_ROWS * shape.vocab * (shape.dtype_bytes + 8)
    return head + lm_head.CHUNK_ELEMS_CUDA * (2 * shape.dtype_bytes + 8)


def device_figures(
    rm: ResolvedModel, dtype: str, device: str
) -> tuple[sizing.ModelShape | None, int | None, str]:
    """(model shape, free bytes of `device`, why either is missing) for the CUDA sizing."""
    if not torch.cuda.is_available():
        return (
            None,
            None,
            "CUDA is not visible from this process; --batch-tokens sizes it for the workers' GPUs",
        )
    free, _total = torch.cuda.mem_get_info(torch.device(device))
    try:
        return model_shape(rm, dtype), int(free), ""
    except (OSError, ValueError) as e:
        return None, int(free), f"model shape unknown: {' '.join(str(e).split())[:160]}"


class HFKind:
    """transformers on a CPU or a GPU; safetensors or GGUF weights."""

    name = "hf"

    def usable(self) -> tuple[bool, str]:
        return True, ""  # transformers and torch are core dependencies

    def default_device(self) -> str:
        return devices.default_device()

    def check_device(self, device: str) -> None:
        devices.check_device(device)

    def pin_model(self, model: ResolvedModel) -> ResolvedModel:
        return pin_revision(model)

    def settle_dtype(self, dtype: str, device: str) -> tuple[str, str | None]:
        return explain_dtype(dtype, device)

    def settle_compile(self, mode: str, est_tokens: Callable[[], int], device: str) -> tuple[str, str | None]:
        on, why = explain_compile(mode, est_tokens() if mode == "auto" else 0, device)
        return ("on" if on else "off"), why

    def settle_batching(
        self, request: BackendRequest, batch_tokens: int | None, shard_rows: int | None
    ) -> tuple[BackendRequest, str | None]:
        dtype = resolve_dtype(request.dtype, request.device)
        invariant, inv_why = explain_batch_invariant(request.batch_invariant, dtype, request.device)
        shape, free, unknown = None, None, ""
        if request.device.startswith("cuda") and (batch_tokens is None or shard_rows is None):
            name = str(dtype).removeprefix("torch.")
            shape, free, unknown = device_figures(request.model, name, request.device)
        fixed = scoring_fixed_bytes(shape) if shape else 0
        sizes = sizing.settle_sizes(request.device, batch_tokens, shard_rows, shape, free, fixed, unknown)
        settled = replace(
            request,
            batch_invariant="on" if invariant else "off",
            batch_tokens=sizes.batch_tokens,
            shard_rows=sizes.shard_rows,
        )
        return settled, f"{inv_why}\n{sizes.why}"

    def identity(self, request: BackendRequest) -> dict:
        dtype = resolve_dtype(request.dtype, request.device)
        invariant, _ = explain_batch_invariant(request.batch_invariant, dtype, request.device)
        batching = batching_identity(dtype, invariant, request.batch_tokens, request.shard_rows)
        return hf_identity(dtype, request.chat_template, request.compile == "on", invariant, batching)

    def command_args(self, request: BackendRequest) -> list[str]:
        # what changes the bytes is spelled out, so the command re-creates them on any device: a compiled
        # forward, batch-invariant scoring, or the batching that fixes which prompts share a pass
        ident = self.identity(request)
        args = ["--dtype", request.dtype] + (["--compile", "on"] if request.compile == "on" else [])
        if ident.get("batch_invariant"):
            args += ["--batch-invariant", "on"]
        if ident.get(BATCHING_KEY):
            b = ident[BATCHING_KEY]
            args += ["--batch-invariant", "off"]
            args += ["--batch-tokens", str(b["batch_tokens"]), "--shard-rows", str(b["shard_rows"])]
        return args

    def gpus_per_worker(self, request: BackendRequest) -> int:
        return 1

    def load(self, request: BackendRequest) -> HFBackend:
        dtype = resolve_dtype(request.dtype, request.device)
        invariant, _ = explain_batch_invariant(request.batch_invariant, dtype, request.device)
        return load_hf_backend(
            request.model,
            dtype=request.dtype,
            device=request.device,
            batch_tokens=request.batch_tokens,
            chat_template=request.chat_template,
            compiled=request.compile == "on",
            batch_invariant=invariant,
            shard_rows=request.shard_rows,
        )


HF = HFKind()
