"""walla serve (and walla market agent) reopens a feature set's model with the options that settle to the
identity it recorded: the backend kind that recorded it says which (the registry's `recorded_options`,
through extract/door.py `recorded_config`); serve names no backend."""

from __future__ import annotations

import pytest
from walla.extract import device as devices
from walla.extract.backends import BackendRequest
from walla.extract.backends.registry import settle_backend
from walla.extract.door import recorded_config
from walla.extract.models import ResolvedModel

RM = ResolvedModel("m", "/models/m", None, None, {"source": "local", "path": "/models/m"})


@pytest.fixture
def h100(monkeypatch):
    """CUDA settles here as on an H100 (nothing runs on it: settling reads names only)."""
    monkeypatch.setattr(devices, "accelerator", lambda device: f"chip of {device.split(':')[0]}")
    monkeypatch.setattr(devices, "kernel_identity", lambda device: {"chip": device.split(":")[0]})


def reopened(identity: dict):
    """What serve's config for `identity` settles to, as extract/door.py `settle_for` settles it."""
    cfg = recorded_config("m", "facts", identity, None)
    request = BackendRequest(RM, cfg.dtype, cfg.device, identity["chat_template"], 32)
    return cfg, settle_backend(cfg.backend, request, cfg.backend_args, recorded=identity.get("batching"))


@pytest.mark.parametrize(
    ("backend", "dtype", "device", "args"),
    [
        (
            "vllm",
            "bfloat16",
            "cuda",
            {
                "tensor_parallel_size": "2",
                "gpu_memory_utilization": "0.8",
                "max_model_len": "512",
                "enforce_eager": "true",
                "batch_invariant": "off",
            },
        ),
        ("vllm", "float32", "cpu", {"enforce_eager": "false", "max_model_len": "256"}),
        ("hf", "bfloat16", "cuda", {"batch_invariant": "off", "max_batch_rows": "2", "compile": "on"}),
        ("hf", "bfloat16", "cuda", {"batch_invariant": "on"}),
        ("hf", "bfloat16", "cpu", {"compile": "off"}),
    ],
)
def test_a_recorded_identity_reopens_with_its_own_backends_options(h100, backend, dtype, device, args):
    request = BackendRequest(RM, dtype, device, False, 32, batch_tokens=4096, shard_rows=64)
    recorded = settle_backend(backend, request, args).identity
    cfg, again = reopened(recorded)
    assert cfg.backend == backend
    assert again.identity == recorded


def test_an_identity_of_a_backend_not_registered_here_is_one_line():
    with pytest.raises(ValueError, match=r"backend 'tgi'.*unknown backend 'tgi'.*available: hf, vllm") as e:
        recorded_config("m", "facts", {"backend": "tgi", "dtype": "float16", "device": "cpu"}, None)
    assert "\n" not in str(e.value)
