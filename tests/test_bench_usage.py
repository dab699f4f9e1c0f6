"""Every benchmark answers --help and a mistyped flag at once: before torch loads (seconds on a shared CPU),
a mistake in one line on stderr naming the script, exit code 2 (issue 39)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(BENCH.glob("*.py"))

# one fresh interpreter runs each script as `python benchmarks/X.py ARGS` would (its folder on sys.path),
# catching its exit; stderr captured; then whether torch (or transformers) got imported on the way
PROBE = """
import contextlib, io, json, runpy, sys
path, args = sys.argv[1], sys.argv[2:]
sys.argv = [path, *args]
sys.path.insert(0, str(__import__("pathlib").Path(path).parent))
err, out = io.StringIO(), io.StringIO()
code = 0
with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
print(json.dumps({"code": code, "stderr": err.getvalue(), "stdout": out.getvalue(),
                  "heavy": sorted(m for m in ("torch", "transformers") if m in sys.modules)}))
"""


def probe(script: Path, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(script), *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_benchmark_is_probed():
    assert len(SCRIPTS) >= 13 and {"train_speed.py", "market_load.py"} <= {p.name for p in SCRIPTS}


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_a_mistyped_flag_is_one_line_and_exit_2(script):
    r = probe(script, "--no-such-flag")
    lines = r["stderr"].strip().splitlines()
    assert r["code"] == 2, r
    assert len(lines) == 1 and lines[0].startswith(f"{script.name}: "), r["stderr"]
    assert r["heavy"] == [], f"{script.name} imported {r['heavy']} before answering"


@pytest.mark.parametrize("script", [p for p in SCRIPTS if p.stem != "extract_shapes"], ids=lambda p: p.stem)
def test_help_answers_before_torch_loads(script):
    r = probe(script, "--help")
    assert r["code"] == 0 and "--help" in r["stdout"], r
    assert r["heavy"] == [], f"{script.name} imported {r['heavy']} for --help"


DEVICE_SCRIPTS = ["extract_invariance", "extract_throughput", "fixed_attention", "serve_load", "train_speed"]


@pytest.mark.parametrize("name", DEVICE_SCRIPTS)
def test_cuda_of_a_cpu_only_torch_is_refused_at_once(name):
    from walla.cli.torch_build import cpu_only_torch

    if not cpu_only_torch():
        pytest.skip("this torch is a CUDA build: torch itself has to tell whether a GPU is usable")
    r = probe(BENCH / f"{name}.py", "--device", "cuda", "--runs", "r", "--scenario", "s", "--store", "st")
    lines = r["stderr"].strip().splitlines()
    assert r["code"] == 2 and len(lines) == 1 and "no CUDA GPU is usable on this machine" in lines[0], r
    assert r["heavy"] == [], r
