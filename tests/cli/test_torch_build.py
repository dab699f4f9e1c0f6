"""`--device cuda` with a CPU-only torch is answered from the distribution's metadata, before torch is imported."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest
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
    torch_build.refuse_cuda_early("train", "cuda")  # a CUDA build: torch itself must tell (no exit here)


@pytest.mark.skipif(torch_build.cpu_only_torch() is None, reason="the installed torch is not a CPU-only build")
@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--scenario", "hetero", "--device", "cuda"],
        ["extract", "--model", "smollm2-135m", "--dataset", "facts", "--device", "cuda:0"],
    ],
)
def test_cuda_on_a_cpu_only_torch_is_a_usage_error_before_torch_loads(argv):
    proc = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, timeout=120)
    assert "exit 2 torch imported False" in proc.stdout, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"walla {argv[0]}: error: --device cuda") and "use --device cpu" in line


def test_a_bad_agent_name_is_answered_before_torch_loads(tmp_path):
    argv = ["market", "add-agent", "bad/name", "--db", str(tmp_path / "m.db")]
    proc = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, timeout=120)
    assert "exit 2 torch imported False" in proc.stdout, proc.stdout + proc.stderr
    assert proc.stderr.startswith("walla market: error: name: expected 1-64 characters"), proc.stderr
    assert not (tmp_path / "m.db").exists()  # nothing opened or created
