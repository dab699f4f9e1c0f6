"""`--device cuda` with a CPU-only torch is answered from the distribution's metadata, before torch is imported."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest
import typer
from walla.cli import torch_build

CHILD = """
import sys
from walla.cli.lazy import run
from walla.cli.main import app
code = run(app, sys.argv[1:], "walla")
print("exit", code, "torch imported", "torch" in sys.modules)
"""


def test_a_cpu_build_is_read_from_its_version(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.13.0+cpu")
    assert torch_build.cpu_only_torch() == "2.13.0+cpu"
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.11.0+cu130")
    assert torch_build.cpu_only_torch() is None


class FakeNvml:
    """NVML's three calls, counting `devices` GPUs (or failing to start with `init`)."""

    def __init__(self, devices: int, init: int = 0):
        self.devices, self.init = devices, init

    def nvmlInit_v2(self):
        return self.init

    def nvmlDeviceGetCount_v2(self, pointer):
        pointer._obj.value = self.devices
        return 0

    def nvmlShutdown(self):
        return 0


def cuda_build(monkeypatch, nvml):
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.13.0")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def load(name):
        if nvml is None:
            raise OSError(f"{name}: cannot open shared object file")
        return nvml

    monkeypatch.setattr(torch_build.ctypes, "CDLL", load)


@pytest.mark.parametrize("nvml", [None, FakeNvml(0)], ids=["no-driver", "no-device"])
def test_a_cuda_build_without_a_gpu_is_a_usage_error(monkeypatch, nvml):
    cuda_build(monkeypatch, nvml)
    with pytest.raises(typer.Exit) as stop:
        torch_build.refuse_cuda_early("train", "cuda")
    assert stop.value.exit_code == 2


def test_a_cuda_build_with_every_gpu_hidden_is_a_usage_error(monkeypatch):
    cuda_build(monkeypatch, FakeNvml(8))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(typer.Exit) as stop:
        torch_build.refuse_cuda_early("extract", "cuda:0")
    assert stop.value.exit_code == 2


@pytest.mark.parametrize(
    ("nvml", "mask"),
    [(FakeNvml(1), None), (FakeNvml(2), "1"), (FakeNvml(0, init=999), None)],
    ids=["one-gpu", "masked-to-one", "nvml-fails"],
)
def test_a_cuda_build_that_may_have_a_gpu_is_left_to_torch(monkeypatch, nvml, mask):
    cuda_build(monkeypatch, nvml)
    if mask is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", mask)
    torch_build.refuse_cuda_early("train", "cuda")  # no exit: torch itself must tell
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.13.0+rocm6.4")
    cuda_build_rocm_nvml = FakeNvml(0)
    monkeypatch.setattr(torch_build.ctypes, "CDLL", lambda name: cuda_build_rocm_nvml)
    torch_build.refuse_cuda_early("train", "cuda")  # ROCm: NVML does not count its devices


@pytest.mark.skipif(
    torch_build.cpu_only_torch() is None, reason="the installed torch is not a CPU-only build"
)
@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--scenario", "hetero", "--device", "cuda"],
        ["extract", "--model", "smollm2-135m", "--dataset", "facts", "--device", "cuda:0"],
        ["serve", "--runs", ".", "--scenario", "hetero", "--device", "cuda"],
    ],
)
def test_cuda_on_a_cpu_only_torch_is_a_usage_error_before_torch_loads(argv):
    proc = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, timeout=120)
    assert "exit 2 torch imported False" in proc.stdout, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"walla {argv[0]}: error: --device cuda") and "use --device cpu" in line


CUDA_BUILD_CHILD = """
import importlib.metadata, sys
importlib.metadata.version = lambda name: "2.13.0"
from walla.cli.lazy import run
from walla.cli.main import app
code = run(app, sys.argv[1:], "walla")
print("exit", code, "torch imported", "torch" in sys.modules)
"""


@pytest.mark.skipif(torch_build.visible_nvidia_gpus() != 0, reason="this machine's NVIDIA driver sees a GPU")
def test_cuda_on_a_cuda_build_without_a_gpu_is_a_usage_error_before_torch_loads():
    argv = ["train", "--scenario", "hetero", "--device", "cuda"]
    proc = subprocess.run(
        [sys.executable, "-c", CUDA_BUILD_CHILD, *argv], capture_output=True, text=True, timeout=120
    )
    assert "exit 2 torch imported False" in proc.stdout, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("walla train: error: --device cuda") and "the NVIDIA driver sees no device" in line


def test_a_bad_agent_name_is_answered_before_torch_loads(tmp_path):
    argv = ["market", "add-agent", "bad/name", "--db", str(tmp_path / "m.db")]
    proc = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, timeout=120)
    assert "exit 2 torch imported False" in proc.stdout, proc.stdout + proc.stderr
    assert proc.stderr.startswith("walla market: error: name: expected 1-64 characters"), proc.stderr
    assert not (tmp_path / "m.db").exists()  # nothing opened or created
