"""Hub revisions enter a feature set's identity as commit shas (a fake local hub cache, offline)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import datasets
import huggingface_hub
import pytest
from tiny_model import tiny_model, tiny_tokenizer
from walla.extract import run as run_mod
from walla.extract.config import ExtractConfig
from walla.extract.models import _hub as hub
from walla.extract.models import pin_revision, resolve_model
from walla.manifests import catalog
from walla.store.features import read_feature_set
from walla.store.questions import question_dir

SHA_A, SHA_B, SHA_C, SHA_D = (c * 40 for c in "abcd")
ARC_ROWS = [
    {"id": f"q{i}", "question": q, "choices": {"text": ["oxygen", "helium", "water"], "label": list("ABC")}}
    | {"answerKey": "ABC"[i % 3]}
    for i, q in enumerate(["Which gas ?", "Which star ?", "Is the door red ?", "Which root ?"])
]


@pytest.fixture
def hf_cache(tmp_path, monkeypatch) -> Path:
    """An empty hub cache and datasets cache under tmp_path, in offline mode (the only mode here)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.prepare_hub_access()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf" / "datasets")
    return tmp_path / "hf"


def _repo_dir(cache: Path, kind: str, repo: str) -> Path:
    return cache / "hub" / f"{kind}s--{repo.replace('/', '--')}"


def _cache_model(cache: Path, repo: str, sha: str, refs: tuple[str, ...], seed: int) -> None:
    """A tiny random model as the hub cache holds it: snapshots/<sha>/ and refs/<ref> -> sha."""
    d = _repo_dir(cache, "model", repo)
    tok = tiny_tokenizer()
    tiny_model(len(tok), seed=seed).save_pretrained(d / "snapshots" / sha)
    tok.save_pretrained(d / "snapshots" / sha)
    (d / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (d / "refs" / ref).write_text(sha)


def _cache_dataset(cache: Path, repo: str, sha: str, rows: list[dict], mtime: float) -> None:
    """A hub dataset as `datasets` keeps its build: <org>___<name>/default/0.0.0/<sha>/<name>-train.arrow."""
    src = cache.parent / f"{sha}.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows))
    built = datasets.load_dataset(
        "json", data_files=[str(src)], split="train", cache_dir=str(cache / "build")
    )
    build_dir = Path(built.cache_files[0]["filename"]).parent
    org, name = repo.split("/")
    dst = cache / "datasets" / f"{org}___{name}" / "default" / "0.0.0" / sha
    dst.mkdir(parents=True)
    shutil.copy(build_dir / "dataset_info.json", dst)
    shutil.copy(build_dir / "json-train.arrow", dst / f"{name}-train.arrow")
    os.utime(dst, (mtime, mtime))  # `datasets` offline loads the newest build


def _set_ref(cache: Path, kind: str, repo: str, ref: str, sha: str) -> None:
    refs = _repo_dir(cache, kind, repo) / "refs"
    refs.mkdir(parents=True, exist_ok=True)
    (refs / ref).write_text(sha)


def _hub_model(revision: str) -> catalog.ModelEntry:
    return catalog.ModelEntry(
        name="tiny", source="hub", hub_id="org/tiny", revision=revision, hidden_size=32, dtype="float32"
    )


def test_resolver_reads_refs_pins_shas_and_fails_in_one_line(hf_cache):
    _cache_model(hf_cache, "org/tiny", SHA_A, ("main",), seed=1)
    _set_ref(hf_cache, "model", "org/tiny", "v2", SHA_B)  # a ref whose snapshot is not cached
    assert hub.resolve_revision("model", "org/tiny", "main", "hint", "config.json") == SHA_A
    assert hub.resolve_revision("model", "org/tiny", SHA_C, "hint") == SHA_C  # a pinned sha as is
    assert hub.resolve_revision("model", "org/tiny", "v2", "hint") == SHA_B  # refs file alone
    assert hub.resolve_revision("model", "org/tiny", "v2", "hint", "config.json") is None  # files missing
    assert hub.resolve_revision("model", "org/other", "main", "hint") is None

    rm = pin_revision(resolve_model(_hub_model("main")))
    assert rm.revision == SHA_A and rm.identity == {"source": "hub", "hub_id": "org/tiny", "revision": SHA_A}
    with pytest.raises(hub.HubUnavailableError) as e:
        pin_revision(resolve_model(_hub_model("v2")))
    msg = str(e.value)
    assert len(msg.splitlines()) == 1
    assert "'org/tiny'" in msg and "HF_HUB_OFFLINE is set and revision 'v2' is not in the local cache" in msg


def _run_model(tmp_path, monkeypatch, revision: str):
    models = dict(catalog.load_models())
    models["tiny"] = _hub_model(revision)
    monkeypatch.setattr(catalog, "load_models", lambda: models)
    data = tmp_path / "arc.jsonl"
    arc = [{"id": r["id"], "question": {"stem": r["question"], "choices": [
        {"text": t, "label": lab} for t, lab in zip(r["choices"]["text"], r["choices"]["label"], strict=True)
    ]}, "answerKey": r["answerKey"]} for r in ARC_ROWS]  # fmt: skip
    data.write_text("\n".join(json.dumps(r) for r in arc))
    cfg = ExtractConfig(
        model="tiny",
        dataset="arc-challenge",
        backend="hf",
        data_file=data,
        store=tmp_path / "s",
        progress=False,
        device="cpu",
        dtype="float32",
    )
    (path,) = run_mod.run(cfg, out=lambda s: None)
    return read_feature_set(path)


def test_extraction_records_the_model_commit(hf_cache, tmp_path, monkeypatch):
    _cache_model(hf_cache, "org/tiny", SHA_A, ("main",), seed=1)
    _cache_model(hf_cache, "org/tiny", SHA_B, ("v2",), seed=2)
    main = _run_model(tmp_path, monkeypatch, "main")
    v2 = _run_model(tmp_path, monkeypatch, "v2")
    pinned = _run_model(tmp_path, monkeypatch, SHA_A)
    assert main.meta["inputs"]["model"] == {"source": "hub", "hub_id": "org/tiny", "revision": SHA_A}
    assert v2.meta["inputs"]["model"]["revision"] == SHA_B
    assert main.meta["fingerprint"] != v2.meta["fingerprint"]
    assert pinned.meta["fingerprint"] == main.meta["fingerprint"]  # same commit, same feature set
    assert (main.hidden[0] != v2.hidden[0]).any()  # each was loaded from its own snapshot
    assert "dataset_revision" not in main.meta["inputs"]  # a local data file keeps its content hash only


def _run_dataset(tmp_path, monkeypatch, revision: str | None):
    sets = dict(catalog.load_datasets())
    spec = {"path": "org/tiny-arc", "split": "train"} | ({"revision": revision} if revision else {})
    sets["tiny-arc"] = catalog.DatasetEntry(
        name="tiny-arc", loader="arc", split_protocol={"mode": "uniform", "ratios": [0, 0.5, 0.5]}, hub=spec
    )
    monkeypatch.setattr(catalog, "load_datasets", lambda: sets)
    cfg = ExtractConfig(
        model="smollm2-135m", dataset="tiny-arc", backend="dummy", store=tmp_path / "s", progress=False
    )
    (path,) = run_mod.run(cfg, out=lambda s: None)
    return read_feature_set(path)


def test_extraction_records_the_dataset_commit(hf_cache, tmp_path, monkeypatch):
    _cache_dataset(hf_cache, "org/tiny-arc", SHA_C, ARC_ROWS, mtime=1e9)
    _set_ref(hf_cache, "dataset", "org/tiny-arc", "main", SHA_C)
    first = _run_dataset(tmp_path, monkeypatch, None)
    assert first.meta["inputs"]["dataset_revision"] == SHA_C
    qdir = question_dir(tmp_path / "s", "tiny-arc", first.meta["inputs"]["questions_fp"])
    qmeta = json.loads((qdir / "meta.json").read_text())
    assert qmeta["source"]["hub"]["revision"] == SHA_C

    _cache_dataset(hf_cache, "org/tiny-arc", SHA_D, ARC_ROWS, mtime=2e9)  # main moved on, same rows
    _set_ref(hf_cache, "dataset", "org/tiny-arc", "main", SHA_D)
    second = _run_dataset(tmp_path, monkeypatch, "main")
    assert second.meta["inputs"]["dataset_revision"] == SHA_D
    assert second.meta["inputs"]["questions_fp"] == first.meta["inputs"]["questions_fp"]
    assert second.meta["fingerprint"] != first.meta["fingerprint"]

    # offline `datasets` loads its newest build whatever the revision: an older pin is refused in one line
    with pytest.raises(hub.HubUnavailableError) as e:
        _run_dataset(tmp_path, monkeypatch, SHA_C)
    assert len(str(e.value).splitlines()) == 1
    assert f"the cached copy is commit {SHA_D}, not revision '{SHA_C}'" in str(e.value)
    with pytest.raises(hub.HubUnavailableError, match="'v9' is"):  # a tag the cache cannot map to a commit
        _run_dataset(tmp_path, monkeypatch, "v9")
