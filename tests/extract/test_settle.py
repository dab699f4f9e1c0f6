"""One door to a backend (issue 27): the fingerprint is what `settle` decided, and every caller settles alike.

Finding 1 of the issue, case by case, on the old behaviour and the new:
- bf16 on a CPU and on CUDA (`batch_invariant=on`, or padded with the same sizes) shared one fingerprint:
  their identities now differ in `device` (and, padded, the accelerator model) and in nothing else;
- float32 with other batch sizes kept one fingerprint: it still does, in the `tolerance` tier, and the rows
  of two batchings agree within the bound that tier records (FP32_PADDED_BOUND);
- vLLM's identity had neither device nor batching: it has both.
A CUDA device is faked where needed (`torch.cuda.is_available()` stays False: the sizes are given or fall
back; the accelerator's name is patched), so this runs on any CPU.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from tiny_model import register_tiny_catalog
from typer.testing import CliRunner
from walla.cli.main import app as walla_root
from walla.extract import device as devices
from walla.extract import door
from walla.extract import parity as check_mod
from walla.extract import run as run_mod
from walla.extract.backends import BackendRequest, Settled
from walla.extract.backends.dummy import DummyBackend
from walla.extract.backends.hf import FP32_PADDED_BOUND, HF
from walla.extract.backends.registry import (
    BACKEND_KINDS,
    backend_kind,
    backend_names,
    identity_difference,
    open_backend,
    recorded_options,
    register_backend,
    settle_backend,
)
from walla.extract.cli import app as extract_app
from walla.extract.config import ExtractConfig
from walla.extract.models import ResolvedModel
from walla.manifests import catalog
from walla.manifests.validate import check, config
from walla.store.cli import app as store_app
from walla.store.features import FeatureSetSpec, read_feature_set

RM = ResolvedModel("m", "/models/m", None, None, {"source": "local", "path": "/models/m"})
CHIPS = {"cpu": "AMD EPYC 7B13", "cuda": "NVIDIA H100 80GB HBM3"}
ROWS = [
    ("Which gas do plants take in ?", "the sun"),
    ("Is the door red ?", "the moon"),
    ("Is the cat on the mat ?", "a tree"),
    ("Which star ?", "root"),
    ("Is the door of room 42 painted blue ?", "leaf"),
    ("Which gas ?", "water light"),
    ("Is the dog in the park with a ball ?", "the sun"),
    ("Is the moon a star ?", "light"),
    ("Which tree has a root ?", "leaf"),
    ("Is the sun a star ?", "water"),
    ("Is water a gas ?", "the park"),
]


@pytest.fixture
def chips(monkeypatch):
    """A CPU and an H100 as `devices.accelerator` and `devices.kernel_identity` name them (no GPU needed)."""
    monkeypatch.setattr(devices, "accelerator", lambda device: CHIPS[device.split(":")[0]])
    monkeypatch.setattr(devices, "kernel_identity", lambda device: {"chip": CHIPS[device.split(":")[0]]})


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """Catalog model `tiny` (a local random checkpoint) and dataset `mine` (a jsonl file); returns the file."""
    data = register_tiny_catalog(tmp_path, monkeypatch, ROWS, seed=5)
    _same_catalog(check_mod, monkeypatch)
    return data


def _same_catalog(mod, monkeypatch) -> None:
    """A module that bound the catalog's functions by name sees the same tables."""
    for name in ("load_models", "load_datasets"):
        if hasattr(mod, name):  # the market agent opens its model through extract/door.py: datasets only
            monkeypatch.setattr(mod, name, getattr(catalog, name))


def request(dtype: str, device: str, **kw) -> BackendRequest:
    return BackendRequest(RM, dtype, device, False, 32, **kw)


def fingerprint(settled: Settled) -> str:
    return FeatureSetSpec("m", "facts", "none", {"questions_fp": "q", **settled.identity}).fingerprint


# ---------------------------------------------------------------------------- finding 1, case by case


def test_cpu_and_cuda_settle_to_different_identities(chips):
    for args, sizes in (
        ({"batch_invariant": "fixed"}, {}),  # the fixed-shape path on both (`on` picks packed on a CPU)
        ({"batch_invariant": "off"}, {"batch_tokens": 4096}),
    ):
        cpu = settle_backend("hf", request("bfloat16", "cpu", shard_rows=256, **sizes), args)
        cuda = settle_backend("hf", request("bfloat16", "cuda", shard_rows=256, **sizes), args)
        machine = {"device", "accelerator", "kernels"}
        # the old identity (what hf recorded before the device was in it) was the same on both ...
        old = [{k: v for k, v in s.identity.items() if k not in machine} for s in (cpu, cuda)]
        assert old[0] == old[1]
        # ... now the device (and, batch-dependent, the chip) tells them apart, and so do their keys
        differ = {k for k in cpu.identity if cpu.identity[k] != cuda.identity.get(k)}
        assert differ == (machine if "batching" in cpu.identity else {"device", "kernels"})
        assert fingerprint(cpu) != fingerprint(cuda)
    assert cpu.tier == cuda.tier == "batch-recorded"
    assert (cpu.identity["accelerator"], cuda.identity["accelerator"]) == (CHIPS["cpu"], CHIPS["cuda"])
    assert cuda.identity["batching"]["batch_tokens"] == 4096 and "--device cuda" in " ".join(
        cuda.command_args
    )


def test_the_accelerator_is_recorded_only_where_the_numbers_are_batch_dependent(chips):
    packed = settle_backend("hf", request("bfloat16", "cuda", batch_tokens=4096), {"batch_invariant": "on"})
    fp32 = settle_backend("hf", request("float32", "cuda", batch_tokens=4096))
    padded = settle_backend("hf", request("bfloat16", "cuda", batch_tokens=4096), {"batch_invariant": "off"})
    assert (packed.tier, fp32.tier, padded.tier) == ("bitwise", "tolerance", "batch-recorded")
    assert "accelerator" not in packed.identity and "accelerator" not in fp32.identity
    # the kernel path is recorded wherever bits are promised (bitwise) or depend on it (batch-recorded)
    assert packed.identity["kernels"] == padded.identity["kernels"] == {"chip": CHIPS["cuda"]}
    assert "kernels" not in fp32.identity  # float32 padded: a bound that holds across paths (test_kernels.py)
    assert padded.identity["accelerator"] == CHIPS["cuda"] and "batching" in padded.identity
    assert all(
        s.identity["device"] == "cuda" and s.identity["determinism"] == s.tier for s in (packed, fp32, padded)
    )


def test_fp32_batchings_keep_one_fingerprint_within_the_recorded_bound(tmp_path, tiny):
    """The issue's case: --shard-rows 5 --batch-tokens 200 and the defaults wrote one float32 fingerprint.
    They still do (tier `tolerance`), and the two sets' rows agree within the bound the tier records."""
    base = dict(model="tiny", dataset="mine", backend="hf", data_file=tiny, progress=False, device="cpu")
    base |= dict(dtype="float32", variants=("none",))
    small = run_mod.run(
        ExtractConfig(**base, store=tmp_path / "a", shard_rows=2, batch_tokens=24), lambda s: None
    )
    default = run_mod.run(ExtractConfig(**base, store=tmp_path / "b"), lambda s: None)
    for a, b in zip(small, default, strict=True):  # (a list: one per variant)
        assert a.name == b.name  # one fingerprint ...
        fa, fb = read_feature_set(a), read_feature_set(b)
        assert fa.meta["inputs"]["determinism"] == "tolerance"
        assert fa.meta["inputs"]["tolerance"] == FP32_PADDED_BOUND  # ... and the bound it promises
        for col, key in (("raw_option_logprobs", "option_logprobs"), ("prompt_nll", "prompt_nll")):
            x = np.array(fa.rows[col].to_list(), dtype=np.float64)
            y = np.array(fb.rows[col].to_list(), dtype=np.float64)
            assert np.abs(x - y).max() <= FP32_PADDED_BOUND[key], col
        ha, hb = (np.asarray(f.hidden[:]).astype(np.float64) for f in (fa, fb))
        rel = np.abs(ha - hb).max(axis=1) / np.abs(hb).max(axis=1)
        assert rel.max() <= FP32_PADDED_BOUND["hidden_relative"]


def test_vllm_identity_records_device_accelerator_and_batching(chips):
    cpu = settle_backend("vllm", request("bfloat16", "cpu", shard_rows=64))
    cuda = settle_backend("vllm", request("bfloat16", "cuda", shard_rows=64))
    more = settle_backend("vllm", request("bfloat16", "cuda", shard_rows=128))
    assert cpu.tier == "batch-recorded" and cpu.identity["device"] == "cpu"
    assert cuda.identity["accelerator"] == CHIPS["cuda"]
    assert (
        cuda.identity["batching"]["shard_rows"] == 64 and cuda.identity["batching"]["enforce_eager"] is False
    )
    assert cpu.identity["batching"]["enforce_eager"] is True  # the settled default, not None
    assert len({fingerprint(cpu), fingerprint(cuda), fingerprint(more)}) == 3
    eager = settle_backend("vllm", request("bfloat16", "cuda", shard_rows=64), {"enforce_eager": "true"})
    assert identity_difference(cuda.identity, eager.identity) == "batching.enforce_eager: False != True"


# ------------------------------------------------------------------------- the same identity everywhere


def test_a_worker_that_settles_another_identity_stops_in_one_line(chips, monkeypatch):
    settled = settle_backend("dummy", request("float32", "cuda"))
    assert isinstance(open_backend(settled, resettle=True), DummyBackend)  # same machine: same identity
    padded = settle_backend("hf", request("bfloat16", "cuda", batch_tokens=4096), {"batch_invariant": "off"})
    monkeypatch.setattr(devices, "accelerator", lambda device: "NVIDIA A100-SXM4-80GB")
    with pytest.raises(ValueError, match="accelerator: 'NVIDIA H100 80GB HBM3' != 'NVIDIA A100-SXM4-80GB'"):
        open_backend(padded, resettle=True)


def test_a_store_set_settled_on_another_device_stops_the_run(tmp_path):
    base = dict(model="smollm2-135m", dataset="facts", backend="dummy", size=20, variants=("none",))
    (cpu,) = run_mod.run(ExtractConfig(**base, store=tmp_path, progress=False, device="cpu"), lambda s: None)
    with pytest.raises(ValueError, match=r"settled with device: 'cpu' != 'cuda' \(recorded != this run's\)"):
        run_mod.run(ExtractConfig(**base, store=tmp_path, progress=False, device="cuda"), lambda s: None)
    # other options are another set, rightly: a new seed is not refused
    cfg = ExtractConfig(**base, store=tmp_path, progress=False, device="cpu", backend_args={"seed": 1})
    (seeded,) = run_mod.run(cfg, lambda s: None)
    assert seeded != cpu


def test_the_market_agent_and_walla_extract_settle_the_same_identity(tmp_path, tiny, monkeypatch):
    pytest.importorskip(
        "httpx", reason="the market agent needs the market extra: pip install 'walla[market]'"
    )
    from walla.market import agent as agent_mod

    _same_catalog(agent_mod, monkeypatch)
    for dtype in ("float32", "bfloat16"):
        feats = agent_mod.LLMFeatures("tiny", "mine", device="cpu", dtype=dtype, backend="hf")
        feats.backend.close()
        cfg = ExtractConfig(
            model="tiny",
            dataset="mine",
            data_file=tiny,
            dtype=dtype,
            device="cpu",
            store=tmp_path / dtype,
            variants=("none",),
            progress=False,
        )
        (path,) = run_mod.run(cfg, lambda s: None)
        stored = read_feature_set(path).meta["inputs"]
        assert {k: stored[k] for k in feats.settled.identity} == feats.settled.identity, dtype


# ------------------------------------------------------------- a third kind, through the registry alone


@config
class TwinOptions:
    """The twin's own option: a key no other kind has."""

    flavor: int = 0  # recorded in its identity (its numbers are hf's)

    def __post_init__(self) -> None:
        check(self.flavor >= 0, "flavor", ">= 0", self.flavor)


class TwinKind:
    """hf under another name with an option of its own: everything walla asks goes through the registry."""

    name = "twin"
    Options = TwinOptions

    def usable(self) -> tuple[bool, str]:
        return True, ""

    def default_device(self) -> str:
        return "cpu"

    def check_device(self, device: str) -> None:
        HF.check_device(device)

    def pin_model(self, model):
        return HF.pin_model(model)

    def settle(self, req: BackendRequest, options: TwinOptions, recorded: dict | None = None) -> Settled:
        hf = HF.settle(req, HF.Options(), recorded)
        identity = {**hf.identity, "backend": "twin", "flavor": options.flavor}
        args = (*hf.command_args, "--backend-arg", f"flavor={options.flavor}")
        return replace(hf, kind="twin", options=options, identity=identity, command_args=args, why=())

    def recorded_options(self, identity: dict) -> dict:
        return {"flavor": identity["flavor"]}

    def gpus_per_worker(self, settled: Settled) -> int:
        return 1

    def load(self, settled: Settled):
        return HF.load(replace(settled, options=HF.Options(compile="off", batch_invariant="off")))


@pytest.fixture
def twin():
    register_backend(TwinKind())
    yield
    BACKEND_KINDS.pop("twin")


def test_a_third_kind_runs_walla_extract_and_walla_check_with_its_own_option(tmp_path, tiny, twin):
    assert "twin" in backend_names()
    common = ["--model", "tiny", "--dataset", "mine", "--data-file", str(tiny), "--device", "cpu"]
    argv = [
        *common,
        "--backend",
        "twin",
        "--backend-arg",
        "flavor=3",
        "--dtype",
        "float32",
        "--variants",
        "none",
    ]
    r = CliRunner().invoke(extract_app, [*argv, "--store", str(tmp_path / "s"), "--no-progress"])
    assert r.exit_code == 0, r.output
    (path,) = [Path(x.strip()) for x in r.output.splitlines() if x.startswith("  ")]
    meta = read_feature_set(path).meta
    assert meta["inputs"]["backend"] == "twin" and meta["inputs"]["flavor"] == 3
    assert "--backend twin" in meta["command"] and "--backend-arg flavor=3" in meta["command"]
    bad = CliRunner().invoke(
        extract_app, [*common, "--backend", "twin", "--backend-arg", "flavor=-1", "--store", str(tmp_path)]
    )
    assert bad.exit_code == 2 and "flavor must be >= 0, got -1" in bad.output
    r = CliRunner().invoke(
        walla_root,
        [
            "check",
            *common,
            "--backends",
            "hf,twin",
            "--backend-arg",
            "flavor=2",
            "--report",
            str(tmp_path / "check.json"),
        ],
    )
    assert r.exit_code == 0, r.output
    assert "twin vs hf" in r.output and "PASS" in r.output
    r = CliRunner().invoke(
        walla_root, ["check", *common, "--backends", "hf,twin", "--backend-arg", "depth=2"]
    )
    assert (
        r.exit_code == 2 and "--backend-arg depth: no compared backend has that option" in r.output
    )  # usage


def test_every_kind_names_the_options_that_settle_to_an_identity_it_recorded(chips, twin):
    """`recorded_options` is `settle`'s inverse (walla serve reopens a set's model with it): a non-default
    option of each kind comes back, and settling with it (and the recorded batching) gives the identity."""
    cases = [
        ("hf", "bfloat16", "cuda", {"batch_invariant": "off", "max_batch_rows": "3", "compile": "on"}),
        ("hf", "bfloat16", "cuda", {"batch_invariant": "on"}),  # the fixed-shape path
        ("hf", "bfloat16", "cpu", {}),  # packed
        ("hf", "float32", "cpu", {"compile": "on"}),  # tolerance: nothing batching-dependent recorded
        ("vllm", "bfloat16", "cuda", {"tensor_parallel_size": "2", "gpu_memory_utilization": "0.7"}),
        ("vllm", "float32", "cpu", {"max_model_len": "128", "enforce_eager": "false"}),
        ("dummy", "float32", "cpu", {"seed": "4", "sharpness": "0.5"}),
        ("twin", "float32", "cpu", {"flavor": "2"}),
    ]
    for kind, dtype, device, args in cases:
        first = settle_backend(kind, request(dtype, device, batch_tokens=2048, shard_rows=32), args)
        options = recorded_options(first.identity)
        again = settle_backend(kind, request(dtype, device), options, recorded=first.identity.get("batching"))
        assert again.identity == first.identity, (kind, args, options)
    assert recorded_options(first.identity) == {"flavor": 2}
    with pytest.raises(KeyError, match="unknown backend 'tgi'"):
        recorded_options({"backend": "tgi"})


# ------------------------------------------------------------------------------------------ where it shows


def test_walla_store_ls_shows_each_sets_tier(tmp_path):
    base = dict(model="smollm2-135m", dataset="facts", backend="dummy", size=20, variants=("none",))
    run_mod.run(ExtractConfig(**base, store=tmp_path, progress=False), lambda s: None)
    r = CliRunner().invoke(store_app, ["ls", "--store", str(tmp_path)])
    assert r.exit_code == 0 and "tier" in r.output
    (line,) = [x for x in r.output.splitlines() if "smollm2-135m" in x]
    assert "bitwise" in line


def test_the_registry_checks_the_catalogs_backend_and_the_catalog_carries_its_options(tmp_path):
    (tmp_path / "models.yaml").write_text(
        "a:\n  source: local\n  path: /m\n  hidden_size: 8\n  backend: tgi\n"
        "b:\n  source: local\n  path: /m\n  hidden_size: 8\n  backend: vllm\n  backend_args: {max_model_len: 4096}\n"
    )
    tgi = catalog.load_models(tmp_path / "models.yaml")["a"]  # any string: this layer imports no stage
    with pytest.raises(
        KeyError, match=r"models.yaml: a.backend: unknown backend 'tgi' \(available: hf, vllm"
    ):
        door.choose_backend(ExtractConfig(model="a", dataset="facts"), tgi)
    (tmp_path / "models.yaml").write_text(
        "b:\n  source: local\n  path: /m\n  hidden_size: 8\n  backend: vllm\n  backend_args: {max_model_len: 4096}\n"
    )
    entry = catalog.load_models(tmp_path / "models.yaml")["b"]
    cfg = ExtractConfig(model="b", dataset="facts", backend_args={"enforce_eager": "false"})
    assert door.backend_args(cfg, entry, "vllm") == {"max_model_len": 4096, "enforce_eager": "false"}
    assert door.backend_args(cfg, entry, "hf") == {"enforce_eager": "false"}  # the hint's options only
    settled = door.settle_for(cfg, door.Target("b", entry, backend_kind("vllm"), "cpu", RM))
    assert settled.options.max_model_len == 4096 and settled.identity["batching"]["enforce_eager"] is False


def test_max_batch_rows_is_a_settled_hf_option_recorded_where_it_moves_numbers(chips):
    """`walla check`'s `hf batch=1` row is an option like any other: settled, in the command, and in the
    identity where padded batches make it change the numbers (a bitwise set's numbers do not move)."""
    padded = settle_backend(
        "hf", request("bfloat16", "cpu", batch_tokens=4096), {"batch_invariant": "off", "max_batch_rows": "1"}
    )
    assert padded.options.max_batch_rows == 1 and padded.identity["batching"]["max_batch_rows"] == 1
    assert "--backend-arg max_batch_rows=1" in " ".join(padded.command_args)
    packed = settle_backend("hf", request("bfloat16", "cpu"), {"max_batch_rows": "1"})
    assert packed.options.max_batch_rows == 1 and packed.tier == "bitwise"
    assert packed.identity == settle_backend("hf", request("bfloat16", "cpu")).identity
    with pytest.raises(ValueError, match="max_batch_rows must be >= 0"):
        settle_backend("hf", request("bfloat16", "cpu"), {"max_batch_rows": "-1"})
