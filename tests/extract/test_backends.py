"""Backend kinds: the registry is the one list of names, each kind answers before loading, the fake is tests-only."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import transformers
from walla.extract.backends import Backend, BackendKind, BackendRequest
from walla.extract.backends.dummy import DUMMY, DummyBackend
from walla.extract.backends.hf import HF, INVARIANT_SCORING
from walla.extract.backends.registry import (
    BACKEND_KINDS,
    backend_kind,
    backend_options,
    register_backend,
    settle_backend,
)
from walla.extract.backends.vllm import VLLM
from walla.extract.command import reproduce_command
from walla.extract.config import ExtractConfig
from walla.extract.device import kernel_identity
from walla.extract.door import choose_backend
from walla.extract.models import ResolvedModel
from walla.manifests import catalog
from walla.manifests.validate import ConfigError

RM = ResolvedModel("m", "/models/m", None, None, {"source": "local", "path": "/models/m"})


def request(
    dtype: str = "float32", hidden_size: int | None = 576, device: str = "cpu", **kw
) -> BackendRequest:
    return BackendRequest(RM, dtype, device, False, hidden_size, **kw)


def test_every_kind_has_every_member_of_the_protocols():
    members = {n for n in vars(BackendKind) if not n.startswith("_")} | set(BackendKind.__annotations__)
    assert members == {
        "name",
        "Options",
        "usable",
        "default_device",
        "check_device",
        "pin_model",
        "settle",
        "recorded_options",
        "gpus_per_worker",
        "load",
    }
    for kind in (HF, VLLM, DUMMY):
        assert not [m for m in members if not hasattr(kind, m)], kind.name
    loaded = {n for n in vars(Backend) if not n.startswith("_")} | set(Backend.__annotations__)
    fake = DummyBackend()
    assert not [m for m in loaded if not hasattr(fake, m)]


def test_users_get_hf_and_vllm_and_the_tests_also_the_fake():
    assert list(BACKEND_KINDS) == ["hf", "vllm", "dummy"]  # dummy: registered by tests/conftest.py
    assert backend_kind("vllm") is VLLM
    with pytest.raises(
        KeyError, match=r"unknown backend 'vlm'; did you mean vllm\? \(available: hf, vllm, dummy\)"
    ):
        backend_kind("vlm")
    register_backend(DUMMY)  # the same object again: nothing changes
    with pytest.raises(ValueError, match="backend 'hf' is registered already"):
        register_backend(type(HF)())


def test_the_user_cli_does_not_offer_the_fake(tmp_path):
    """A fresh interpreter has only the registry's kinds: `--backend dummy` is a bad option there."""
    argv = ["-m", "walla.extract.cli", "--model", "smollm2-135m", "--dataset", "facts", "--backend", "dummy"]
    r = subprocess.run(
        [sys.executable, *argv, "--store", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == ("walla extract: error: backend must be one of ('hf', 'vllm'), got 'dummy'"), (
        r.stderr
    )
    assert not (tmp_path / "questions").exists()


def test_identities_before_loading():
    assert settle_backend("dummy", request()).identity == {
        "model": RM.identity,
        "backend": "dummy",
        "hidden_size": 576,
        "seed": 0,
        "sharpness": 2.0,
        "device": "cpu",
        "determinism": "bitwise",
    }
    want = {
        "model": RM.identity,
        "backend": "hf",
        "transformers": transformers.__version__,
        "torch": torch.__version__.split("+")[0],
        "dtype": "float32",
        "chat_template": False,
        "nll": "real-tokens",
        "device": "cpu",
        "determinism": "tolerance",
        "tolerance": {"option_logprobs": 1e-4, "prompt_nll": 1e-4, "hidden_relative": 1e-3},
    }
    assert settle_backend("hf", request(), {"compile": "off"}).identity == want
    on = settle_backend("hf", request(dtype="bfloat16"), {"compile": "on"})
    assert on.tier == "bitwise" and on.identity == {
        **{k: v for k, v in want.items() if k != "tolerance"},
        "dtype": "bfloat16",
        "compile": True,
        "batch_invariant": True,  # packed scoring: the default in reduced precision on a CPU
        "invariant_scoring": INVARIANT_SCORING,  # the version of its numerics
        "determinism": "bitwise",
        "kernels": kernel_identity("cpu"),  # bits are promised: the kernel path that makes them is named
    }


def test_each_kind_spells_its_own_options_in_the_recorded_command():
    cfg = ExtractConfig(model="m", dataset="facts", size=30, store="s")
    head = "walla extract --model m --dataset facts --variants none --store s --backend"
    cases = {
        "dummy": (
            {},
            f"{head} dummy --device cpu --backend-arg seed=0 --backend-arg sharpness=2.0 --size 30",
        ),
        "hf": (
            {"compile": "on"},
            f"{head} hf --dtype float32 --device cpu --backend-arg compile=on --backend-arg batch_invariant=off "
            "--size 30",
        ),
        "vllm": (
            {"tensor_parallel_size": "4"},
            f"{head} vllm --dtype float32 --device cpu --shard-rows 256 --backend-arg tensor_parallel_size=4 "
            "--backend-arg enforce_eager=True --backend-arg batch_invariant=off --size 30",
        ),
    }
    gpus = {}
    for name, (args, want) in cases.items():
        settled = settle_backend(name, request(), args)
        assert reproduce_command(cfg, ["none"], name, list(settled.command_args)) == want
        gpus[name] = backend_kind(name).gpus_per_worker(settled)
    assert gpus == {"dummy": 1, "hf": 1, "vllm": 4}


def test_options_are_each_kinds_own_and_checked_in_one_line():
    assert backend_options("hf", {"compile": "on"}).compile == "on"
    assert backend_options("vllm", {"max_model_len": "4096"}).max_model_len == 4096
    with pytest.raises(ConfigError, match=r"--backend-arg \(backend hf\)\.max_model_len: unknown key"):
        backend_options("hf", {"max_model_len": "4096"})
    with pytest.raises(ConfigError, match="batch_invariant must be auto, on, off or fixed, got 'maybe'"):
        backend_options("hf", {"batch_invariant": "maybe"})
    with pytest.raises(ConfigError, match="gpu_memory_utilization must be in"):
        backend_options("vllm", {"gpu_memory_utilization": "1.5"})


def test_settling_auto_is_the_backends_business():
    big = settle_backend("hf", request(est_tokens=lambda: 10**6))
    small = settle_backend("hf", request(est_tokens=lambda: 10))
    assert (big.options.compile, small.options.compile) == ("on", "off")

    def never() -> int:
        raise AssertionError("only hf estimates the job's tokens")

    assert settle_backend("vllm", request(est_tokens=never)).options.enforce_eager is True  # a CPU: eager
    # vLLM's `auto` is measured as hf's is: the fingerprint records the dtype the engine is started with
    assert settle_backend("vllm", request()).dtype == settle_backend("hf", request()).dtype == "float32"
    assert settle_backend("dummy", request(dtype="bfloat16")).dtype == "bfloat16"
    assert settle_backend("hf", request()).why[0] == "dtype float32: as given, not measured"


def test_fake_needs_no_device_or_hub_but_checks_the_name():
    DUMMY.check_device("cuda:3")  # nothing runs on it
    with pytest.raises(ValueError, match="--device must be cpu, cuda, cuda:N or mps, got 'gpu'"):
        DUMMY.check_device("gpu")
    hub_model = ResolvedModel(
        "x", "org/x", None, "main", {"source": "hub", "id": "org/x", "revision": "main"}
    )
    assert DUMMY.pin_model(hub_model) is hub_model


def test_a_vllm_hint_falls_back_to_hf_where_vllm_cannot_run(monkeypatch):
    aloe = catalog.load_models()["aloe"]
    assert aloe.backend == "vllm"
    cfg = ExtractConfig(model="aloe", dataset="medmcqa")
    monkeypatch.setattr(VLLM, "usable", lambda: (False, "vLLM is not installed"))
    assert choose_backend(cfg, aloe) is HF
    monkeypatch.setattr(VLLM, "usable", lambda: (True, ""))
    assert choose_backend(cfg, aloe) is VLLM
    assert choose_backend(ExtractConfig(model="aloe", dataset="medmcqa", backend="dummy"), aloe) is DUMMY
