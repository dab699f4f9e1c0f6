"""A GGUF file's sha256 (its model's identity) is read once per version of the file, not on every run."""

from __future__ import annotations

import hashlib
import os
import time

import pytest
from walla.extract import models
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
    real = models.sha256_file
    monkeypatch.setattr(models, "sha256_file", lambda p: hashed.append(p) or real(p))
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
