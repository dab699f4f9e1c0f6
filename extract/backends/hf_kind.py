"""The `hf` backend kind: how walla-extract settles, fingerprints and loads a transformers model.

The scoring itself is extract/backends/hf.py; this is the registry's view of it. `--dtype auto` is
measured once per machine (extract/dtype_probe.py) and `--compile auto` follows the job's size
(extract/backends/hf_compile.py), both BEFORE the fingerprint is computed, so the fingerprint records
what the model actually runs in.
"""

from __future__ import annotations

from collections.abc import Callable

from walla.extract import device as devices
from walla.extract.backends import BackendRequest
from walla.extract.backends.hf import HFBackend, explain_dtype, hf_identity, load_hf_backend, resolve_dtype
from walla.extract.backends.hf_compile import explain_compile
from walla.extract.models import ResolvedModel, pin_revision


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

    def identity(self, request: BackendRequest) -> dict:
        dtype = resolve_dtype(request.dtype, request.device)
        return hf_identity(dtype, request.chat_template, request.compile == "on")

    def command_args(self, request: BackendRequest) -> list[str]:
        # a compiled forward rounds differently: `--compile on` is part of what re-creates the bytes
        return ["--dtype", request.dtype] + (["--compile", "on"] if request.compile == "on" else [])

    def gpus_per_worker(self, request: BackendRequest) -> int:
        return 1

    def load(self, request: BackendRequest) -> HFBackend:
        return load_hf_backend(
            request.model,
            dtype=request.dtype,
            device=request.device,
            batch_tokens=request.batch_tokens,
            chat_template=request.chat_template,
            compiled=request.compile == "on",
        )


HF = HFKind()
