"""Backend kinds: the registry is the one list of names, each kind answers before loading, the fake is tests-only."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import transformers
from walla.extract.backends import BackendKind
from walla.extract.backends.dummy import DUMMY
from walla.extract.backends.hf import INVARIANT_SCORING
from walla.extract.backends.hf_kind import HF
from walla.extract.backends.registry import BACKEND_KINDS, backend_kind, register_backend
from walla.extract.backends.vllm import VLLM
from walla.extract.command import reproduce_command
from walla.extract.config import ExtractConfig
from walla.extract.models import ResolvedModel
from walla.extract.run import backend_request, choose_backend
from walla.manifests import catalog

RM = ResolvedModel("m", "/models/m", None, None, {"source": "local", "path": "/models/m"})


def request(cfg: ExtractConfig, dtype: str = "float32", hidden_size: int | None = 576):
    return backend_request(cfg, RM, dtype, "cpu", False, hidden_size)


def test_every_kind_has_every_method_of_the_protocol():
    members = {n for n in vars(BackendKind) if not n.startswith("_")} | set(BackendKind.__annotations__)
    assert {"name", "usable", "identity", "load", "command_args", "pin_model"} <= members
    for kind in (HF, VLLM, DUMMY):
        assert not [m for m in members if not hasattr(kind, m)], kind.name


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
    assert r.stderr.strip() == (
        "walla-extract: error: command line: backend must be one of ('hf', 'vllm'), got 'dummy'"
    ), r.stderr
    assert not (tmp_path / "questions").exists()


def test_identities_before_loading():
    cfg = ExtractConfig(model="m", dataset="facts", compile="off")
    assert DUMMY.identity(request(cfg)) == {
        "backend": "dummy",
        "hidden_size": 576,
        "seed": 0,
        "sharpness": 2.0,
    }
    want = {
        "backend": "hf",
        "transformers": transformers.__version__,
        "torch": torch.__version__.split("+")[0],
        "dtype": "float32",
        "chat_template": False,
        "nll": "real-tokens",
    }
    assert HF.identity(request(cfg)) == want
    on = ExtractConfig(model="m", dataset="facts", compile="on")
    assert HF.identity(request(on, dtype="bfloat16")) == {
        **want,
        "dtype": "bfloat16",
        "compile": True,
        "batch_invariant": True,  # packed scoring: the default in reduced precision
        "invariant_scoring": INVARIANT_SCORING,  # the version of its numerics
    }


def test_each_kind_spells_its_own_options_in_the_recorded_command():
    cfg = ExtractConfig(model="m", dataset="facts", size=30, store="s", compile="on", tensor_parallel_size=4)
    head = "walla-extract --model m --dataset facts --variants none --store s --backend"
    cases = {
        DUMMY: f"{head} dummy --size 30",
        HF: f"{head} hf --dtype float32 --compile on --size 30",
        VLLM: f"{head} vllm --dtype float32 --size 30",
    }
    for kind, want in cases.items():
        assert reproduce_command(cfg, ["none"], kind.name, kind.command_args(request(cfg))) == want
    assert [k.gpus_per_worker(request(cfg)) for k in (HF, VLLM, DUMMY)] == [1, 4, 1]


def test_settling_auto_is_the_backends_business():
    assert HF.settle_compile("auto", lambda: 10**6, "cpu")[0] == "on"
    assert HF.settle_compile("auto", lambda: 10, "cpu")[0] == "off"

    def never() -> int:
        raise AssertionError("only hf estimates the job's tokens")

    assert VLLM.settle_compile("auto", never, "cpu") == ("auto", None)
    # vLLM's `auto` is measured as hf's is: the fingerprint records the dtype the engine is started with
    assert VLLM.settle_dtype("float32", "cpu") == HF.settle_dtype("float32", "cpu")
    assert DUMMY.settle_dtype("bfloat16", "cpu") == ("bfloat16", None)
    assert HF.settle_dtype("float32", "cpu") == ("float32", "float32: as given, not measured")


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
