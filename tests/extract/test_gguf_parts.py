"""Models from numbered chunk packages (gguf: "parts()"): joined in part order, used only once every part and the
joined file match the recorded sizes and sha256; anything else is one line naming the package or the file.

The packages here are fakes laid out as the real ones install (`<dist>/data/partNN.bin` + a dist-info with
METADATA and RECORD) in a temporary site directory: no download.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from walla.extract.models import _parts as gguf_parts
from walla.extract.models import _resolve as models
from walla.manifests import catalog

CHUNKS = [b"GGUF" + b"\x01" * 60, b"\x02" * 64, b"\x03" * 17]


def fake_parts(site: Path, chunks=CHUNKS, version: str = "0.9.0") -> gguf_parts.PartsModel:
    """Chunk packages fake-part1..N installed into `site`, and their record (what model_parts.yaml holds)."""
    parts = []
    for i, data in enumerate(chunks, 1):
        mod = f"fake_part{i}"
        rel = f"{mod}/data/part{i:02d}.bin"
        (site / mod / "data").mkdir(parents=True)
        (site / rel).write_bytes(data)
        info = site / f"{mod}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fake-part{i}\nVersion: {version}\n")
        (info / "RECORD").write_text(f"{rel},,\n")
        parts.append(
            gguf_parts.Part(f"fake-part{i}", version, rel, len(data), hashlib.sha256(data).hexdigest())
        )
    whole = b"".join(chunks)
    return gguf_parts.PartsModel(
        "fake", "fake.gguf", len(whole), hashlib.sha256(whole).hexdigest(), tuple(parts)
    )


@pytest.fixture
def pm(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("WALLA_CACHE", str(tmp_path / "cache"))
    return fake_parts(site)


def one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg, msg
    return msg


def test_parts_are_joined_in_order_into_the_cache_and_reused(pm):
    out = gguf_parts.assemble(pm)
    assert out == gguf_parts.cache_path(pm) and out.read_bytes() == b"".join(CHUNKS)
    assert not list(out.parent.glob("*.incomplete"))
    assert gguf_parts.assemble(pm) == out  # verified again (memoized hash), not joined again
    assert pm.packages() == "fake-part1..3 ==0.9.0"


def test_a_changed_byte_of_the_joined_file_is_refused_in_one_line(pm):
    out = gguf_parts.assemble(pm)
    data = bytearray(out.read_bytes())
    data[10] ^= 0xFF
    out.write_bytes(bytes(data))
    with pytest.raises(ValueError) as err:
        gguf_parts.assemble(pm)
    msg = one_line(err)
    assert "fake-part1..3 ==0.9.0" in msg and "has sha256" in msg and f"rm {out}" in msg


def test_a_truncated_joined_file_is_refused_in_one_line(pm):
    out = gguf_parts.assemble(pm)
    out.write_bytes(out.read_bytes()[:-1])
    with pytest.raises(ValueError) as err:
        gguf_parts.assemble(pm)
    assert "fake-part1..3" in one_line(err) and f"is {pm.size - 1:,} bytes" in str(err.value)


@pytest.mark.parametrize("damage", ["missing", "truncated", "changed", "version"])
def test_a_bad_part_names_its_package_and_nothing_is_joined(pm, tmp_path, damage):
    site = tmp_path / "site"
    part = site / pm.parts[1].path
    if damage == "missing":
        for p in site.glob("fake_part2*"):
            import shutil

            shutil.rmtree(p)
    elif damage == "truncated":
        part.write_bytes(part.read_bytes()[:-3])
    elif damage == "changed":
        part.write_bytes(b"\x09" + part.read_bytes()[1:])
    else:
        (site / "fake_part2-0.9.0.dist-info" / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: fake-part2\nVersion: 0.9.1\n"
        )
    with pytest.raises(ValueError) as err:
        gguf_parts.assemble(pm)
    msg = one_line(err)
    assert "part package fake-part2" in msg, msg
    want = {
        "missing": "is not installed",
        "truncated": "truncated",
        "changed": "(changed)",
        "version": "0.9.1",
    }
    assert want[damage] in msg
    assert not gguf_parts.cache_path(pm).exists()


def test_a_parts_model_resolves_to_the_verified_file_and_an_unverified_one_never_loads(pm, monkeypatch):
    monkeypatch.setattr(gguf_parts, "load_parts", lambda path=None: {"fake": pm})
    entry = catalog.ModelEntry(
        name="fake", source="package", package="fake_part1", gguf="parts()", hidden_size=8
    )
    rm = models.resolve_model(entry)
    assert Path(rm.load_from) / rm.gguf_file == gguf_parts.cache_path(pm)
    assert rm.identity["gguf_sha256"] == pm.sha256
    out = gguf_parts.cache_path(pm)
    out.write_bytes(b"X" + out.read_bytes()[1:])
    with pytest.raises(ValueError, match="not the recorded file"):
        models.resolve_model(entry)  # resolution comes before any load, conversion or feature set


def test_the_project_records_both_qwen_models_parts():
    table = gguf_parts.load_parts()
    assert table["qwen2.5-coder-0.5b"].size == 491_400_064 and len(table["qwen2.5-coder-0.5b"].parts) == 6
    assert table["qwen2.5-coder-1.5b"].size == 1_117_320_768 and len(table["qwen2.5-coder-1.5b"].parts) == 22
    models_ = catalog.load_models()
    for name, pm in table.items():
        assert models_[name].gguf == "parts()" and models_[name].package == pm.parts[0].path.split("/")[0]
        assert [p.package for p in pm.parts] == [
            f"{pm.parts[0].package[:-1]}{i}" for i in range(1, len(pm.parts) + 1)
        ]
