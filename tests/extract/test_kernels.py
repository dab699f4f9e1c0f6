"""One fingerprint, one kernel path (issue 37 finding 1): a bf16 set records the kernel path that computed it, so
a run on another path (a CPU without AVX512-bf16, emulated here by capping oneDNN and ATen at AVX2 in a
subprocess) settles another identity, and neither resumes the set nor reports it complete: it stops with one
line naming the field. float32 sets keep one fingerprint across paths, within the bound their tier records.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_settle import ROWS
from tiny_model import register_tiny_catalog
from walla.extract import device as devices
from walla.extract import door, dtype_probe
from walla.extract import run as run_mod
from walla.extract.backends.hf import FP32_PADDED_BOUND, HFBackend
from walla.extract.backends.registry import identity_difference
from walla.extract.config import ExtractConfig
from walla.extract.door import settle_for
from walla.store.features import FeatureSetSpec, read_feature_set

# a CPU without AVX512-bf16, as far as oneDNN's GEMMs and ATen's vector kernels can tell
AVX2 = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
TESTS = Path(__file__).resolve().parent

# the run in the child process: the same catalog model and dataset, then the identity it settles, its dtype-probe
# machine key (the hf checks' cache key) and the run's paths or its one-line error
CHILD = """
import json, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from pytest import MonkeyPatch
from tiny_model import register_jsonl_dataset, register_local_model
from walla.extract import dtype_probe, run as run_mod
from walla.extract.config import ExtractConfig
from walla.extract import door
from walla.extract.door import settle_for
args = json.loads(sys.argv[1])
mp = MonkeyPatch()
register_local_model(mp, "tiny", Path(args["model_dir"]), hidden_size=32)
register_jsonl_dataset(mp, Path(args["data"]), args["rows"])
cfg = ExtractConfig(**args["cfg"])
print("IDENTITY " + json.dumps(settle_for(cfg).identity))
print("MACHINE " + dtype_probe.machine_key("cpu"))
try:
    print("PATHS " + json.dumps([str(p) for p in run_mod.run(cfg, out=lambda s: None)]))
except ValueError as e:
    print("ERROR " + str(e))
    sys.exit(1)
"""


def rows_of(data: Path) -> list[dict]:
    """The dataset rows as the catalog fixture wrote them (without the split it added)."""
    return [{k: v for k, v in json.loads(x).items() if k != "split"} for x in data.read_text().splitlines()]


def in_child(tmp_path: Path, data: Path, cfg: dict, env: dict) -> tuple[int, dict[str, str]]:
    """Run `cfg` in a fresh interpreter with `env` added: (exit code, {IDENTITY/MACHINE/PATHS/ERROR: text})."""
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(tests=str(TESTS)))
    args = {"model_dir": str(tmp_path / "tiny"), "data": str(data), "rows": rows_of(data), "cfg": cfg}
    r = subprocess.run(
        [sys.executable, str(script), json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )
    lines = dict(x.split(" ", 1) for x in r.stdout.splitlines() if x.split(" ", 1)[0].isupper() and " " in x)
    assert "IDENTITY" in lines, r.stdout + r.stderr
    return r.returncode, lines


def config(tmp_path: Path, data: Path, dtype: str, store: str) -> dict:
    return dict(
        model="tiny",
        dataset="mine",
        backend="hf",
        data_file=str(data),
        device="cpu",
        dtype=dtype,
        variants=["none"],
        store=str(tmp_path / store),
        progress=False,
        shard_rows=4,
    )


def fingerprint(identity: dict) -> str:
    return FeatureSetSpec("tiny", "mine", "none", {"questions_fp": "q", **identity}).fingerprint


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    return register_tiny_catalog(tmp_path, monkeypatch, ROWS, seed=5)


@pytest.mark.heavy
def test_a_bf16_set_is_never_continued_or_reported_complete_on_another_cpu_kernel_path(
    tmp_path, tiny, monkeypatch
):
    cfg = config(tmp_path, tiny, "bfloat16", "s")
    here_cfg = ExtractConfig(**{**cfg, "variants": ("none",)})
    here = settle_for(here_cfg).identity
    assert here["determinism"] == "bitwise" and here["kernels"]["cpu_capability"]
    # killed after its first shard of 4 rows, on this machine's own kernel path
    orig, calls = HFBackend.score, {"n": 0}

    def killed(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return orig(self, *a, **k)

    monkeypatch.setattr(HFBackend, "score", killed)
    with pytest.raises(KeyboardInterrupt):
        run_mod.run(here_cfg, out=lambda s: None)
    monkeypatch.setattr(HFBackend, "score", orig)

    # resumed where oneDNN and ATen are capped at AVX2: another identity, and the resume stops in one line
    code, out = in_child(tmp_path, tiny, cfg, AVX2)
    there = json.loads(out["IDENTITY"])
    assert there["kernels"]["isa_env"] == {"ONEDNN_MAX_CPU_ISA": "AVX2"}
    diff = identity_difference(here, there)
    assert diff is not None and diff.startswith("kernels.") and fingerprint(here) != fingerprint(there)
    assert out["MACHINE"] != dtype_probe.machine_key(
        "cpu"
    )  # the hf checks' cached verdicts are the path's own
    assert code == 1 and "\n" not in out["ERROR"], out
    assert f"settled with {diff} (recorded != this run's): resume it where it was started" in out["ERROR"]

    # finished here, the complete set is not "already complete" there either
    lines: list[str] = []
    (path,) = run_mod.run(here_cfg, out=lines.append)
    assert any("resuming" in x and "after 4 durable rows" in x for x in lines)
    assert read_feature_set(path).meta["inputs"]["kernels"] == here["kernels"]
    monkeypatch.setattr(devices, "kernel_identity", lambda device: there["kernels"])  # the child's path, here
    with pytest.raises(ValueError, match=rf"settled with {re.escape(diff)} .*use it where it was made"):
        run_mod.run(here_cfg, out=lambda s: None)


@pytest.mark.heavy
def test_float32_keeps_one_fingerprint_across_cpu_kernel_paths_within_its_bound(tmp_path, tiny):
    """The tolerance tier does not record the kernel path: another path moves float32 results by float32
    rounding only, inside FP32_PADDED_BOUND (hf/kind.py's docstring), checked here under the AVX2 cap."""
    cfg = config(tmp_path, tiny, "float32", "a")
    (here,) = run_mod.run(ExtractConfig(**{**cfg, "variants": ("none",)}), out=lambda s: None)
    code, out = in_child(tmp_path, tiny, {**cfg, "store": str(tmp_path / "b")}, AVX2)
    assert code == 0, out
    assert "kernels" not in json.loads(out["IDENTITY"])
    (there,) = (Path(p) for p in json.loads(out["PATHS"]))
    assert there.name == here.name  # one fingerprint ...
    a, b = read_feature_set(here), read_feature_set(there)
    for col, key in (("raw_option_logprobs", "option_logprobs"), ("prompt_nll", "prompt_nll")):
        x = np.array(a.rows[col].to_list(), dtype=np.float64)
        y = np.array(b.rows[col].to_list(), dtype=np.float64)
        assert np.abs(x - y).max() <= FP32_PADDED_BOUND[key], col  # ... and the bound it promises
    ha, hb = (np.asarray(f.hidden[:]).astype(np.float64) for f in (a, b))
    assert (np.abs(ha - hb).max(axis=1) / np.abs(hb).max(axis=1)).max() <= FP32_PADDED_BOUND[
        "hidden_relative"
    ]


def test_a_served_set_recorded_on_another_kernel_path_is_refused_before_loading(tmp_path, tiny, monkeypatch):
    """`open_for(cfg, expect=identity)` (the market's agents, `walla serve`) compares the kernel path too."""
    cfg = ExtractConfig(model="tiny", dataset="mine", backend="hf", device="cpu", dtype="bfloat16")
    here = settle_for(cfg).identity
    recorded = {**here, "kernels": {**here["kernels"], "cpu_capability": "AVX2_VNNI_SOMEWHERE_ELSE"}}
    monkeypatch.setattr(door, "open_backend", lambda settled: pytest.fail("loaded despite another identity"))
    with pytest.raises(
        door.IdentityMismatch, match=r"kernels\.cpu_capability: 'AVX2_VNNI_SOMEWHERE_ELSE' != "
    ):
        door.open_for(cfg, expect=recorded)


def test_the_cuda_kernel_path_names_the_gpu_its_capability_and_libraries(monkeypatch):
    """No GPU needed: torch's CUDA queries answer as an H200 with CUDA 12.8 and cuDNN 9.1 would."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (9, 0))
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91002)
    got = devices.kernel_identity("cuda:0")
    assert {k: got[k] for k in ("gpu", "capability", "cuda", "cudnn")} == {
        "gpu": "NVIDIA H200",
        "capability": "9.0",
        "cuda": "12.8",
        "cudnn": 91002,
    }
    assert "cublas" in got  # the pip wheel's version where installed, else None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert devices.kernel_identity("cuda") == {"gpu": "unknown (CUDA is not visible to this process)"}
