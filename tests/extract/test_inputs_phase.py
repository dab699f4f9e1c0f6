"""`walla extract`'s inputs phase reads names, the device and the questions, and imports no scoring module:
transformers' modeling code (1.5-3 s, a fixed cost) is imported when the backend settles (issue 39: the
phase took 2.9-5.0 s for 2,291 or 9,164 ARC questions on a GPU host)."""

from __future__ import annotations

import os
import subprocess
import sys

from tiny_model import save_tiny_checkpoint

CHILD = r"""
import sys
from walla.extract import run as recipe
from walla.extract.config import ExtractConfig

class Settling(Exception):
    pass

def settle_run(*args, **kwargs):  # the phase after inputs: stop there and say what the inputs imported
    print("transformers" in sys.modules, "walla.extract.backends.hf._backend" in sys.modules)
    raise Settling

recipe.settle_for = settle_run  # run.py settles through extract/door.py settle_for
cfg = ExtractConfig(model=sys.argv[1], dataset="facts", size=40, device="cpu", store=sys.argv[2], progress=False)
try:
    recipe.run(cfg, out=lambda line: None)
except Settling:
    pass
"""


def imported_by_the_inputs_phase(tmp_path, model) -> list[str]:
    """(transformers, the hf scoring) imported by the time the backend settles: 'True'/'False' each."""
    env = {**os.environ, "WALLA_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(model), str(tmp_path / "store")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_the_inputs_phase_imports_no_scoring_module(tmp_path):
    model = save_tiny_checkpoint(tmp_path / "tiny")
    got = imported_by_the_inputs_phase(tmp_path, model)
    assert got == ["False", "False"], got  # neither transformers nor the hf scoring


def test_a_gguf_models_digest_imports_no_transformers(tmp_path):
    """A GGUF file's sha256 (its identity, hashed or read from the memo under $WALLA_CACHE) needs the cache
    folder only: the embedded models' inputs phase imported transformers for it (via gguf_cache, 1.5-3 s)."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"a" * 1000)  # the inputs phase hashes the file; nothing parses it
    assert imported_by_the_inputs_phase(tmp_path, model) == ["False", "False"]
