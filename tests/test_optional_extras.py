"""The suite collects without the optional extras: a test that needs one skips, naming it, instead of breaking
collection (`pytest -m gpu` on a GPU host without the market extra stopped at tests/cli/test_root.py).

A test module imports an extra's package, or a walla module that imports one (walla.market.api._server: fastapi;
walla.market.agent: httpx), inside the test or after `pytest.importorskip`, never at its top. This test
collects the whole suite in a child interpreter where those packages cannot be imported (a sitecustomize
puts None in sys.modules: `import fastapi` raises ModuleNotFoundError, importlib.util.find_spec answers None,
as where they are not installed).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the import names of pyproject.toml's optional extras: market (with starlette, under fastapi), then ray, s3 (and
# moto, the dev extra's S3 server) and vllm
MARKET = ("fastapi", "starlette", "uvicorn", "sqlalchemy", "httpx", "psycopg", "playwright")
EXTRAS = (*MARKET, "ray", "s3fs", "moto", "vllm")
SITE = """import sys
for name in {names!r}:
    sys.modules[name] = None  # as if not installed: import raises ModuleNotFoundError
"""


def _without_extras(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "sitecustomize.py").write_text(SITE.format(names=EXTRAS))
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )


def test_the_suite_collects_without_the_optional_extras(tmp_path):
    probe = f"import importlib.util as u; print([n for n in {EXTRAS!r} if u.find_spec(n) is not None])"
    assert _without_extras(tmp_path, "-c", probe).stdout.strip() == "[]"  # the child sees none of them

    proc = _without_extras(
        tmp_path, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "error" not in out.splitlines()[-1], out[-4000:]
    assert "pip install 'walla[market]'" in out  # the market's tests skipped, saying which extra they need
