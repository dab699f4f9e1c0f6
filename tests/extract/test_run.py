"""The extraction recipe end to end into a tmp store: dummy backend and a tiny local HF model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_model import tiny_model, tiny_tokenizer
from walla.extract import dtype_probe
from walla.extract import run as run_mod
from walla.extract.backends.dummy import DUMMY, DummyBackend
from walla.extract.config import ExtractConfig
from walla.manifests import catalog
from walla.store.features import read_feature_set
from walla.store.questions import read_question_table

ARC = [
    {
        "id": "q0",
        "question": {
            "stem": "Which gas?",
            "choices": [
                {"text": t, "label": lab}
                for t, lab in zip(["oxygen", "carbon dioxide", "helium", "water"], "ABCD", strict=True)
            ],
        },
        "answerKey": "B",
    },
    {
        "id": "q1",
        "question": {
            "stem": "Three?",
            "choices": [{"text": t, "label": lab} for t, lab in zip("xyz", "ABC", strict=True)],
        },
        "answerKey": "C",
    },
    {
        "id": "q2",
        "question": {
            "stem": "Numeric?",
            "choices": [{"text": t, "label": lab} for t, lab in zip("wxyz", "1234", strict=True)],
        },
        "answerKey": "4",
    },
    {
        "id": "q3",
        "question": {
            "stem": "Five?",
            "choices": [{"text": t, "label": lab} for t, lab in zip("vwxyz", "ABCDE", strict=True)],
        },
        "answerKey": "E",
    },
]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def _lines():
    lines: list[str] = []
    return lines, lines.append


def test_dummy_arc_variable_options(tmp_path):
    data = _write_jsonl(tmp_path / "arc.jsonl", ARC)
    lines, out = _lines()
    cfg = ExtractConfig(
        model="smollm2-135m",
        dataset="arc-challenge",
        backend="dummy",
        data_file=data,
        store=tmp_path / "store",
        progress=False,
    )
    [path] = run_mod.run(cfg, out=out)
    fs = read_feature_set(path)
    q, _ = read_question_table(tmp_path / "store", "arc-challenge")
    assert q.height == 4 and fs.rows["question_id"].to_list() == ["q0", "q1", "q2", "q3"]
    assert fs.rows["n_options"].to_list() == [4, 3, 4, 5]
    assert fs.rows["option_logprobs"].list.len().to_list() == [4, 3, 4, 5]
    for lp in fs.rows["option_logprobs"].to_list():
        assert abs(np.logaddexp.reduce(np.array(lp, dtype=np.float64))) < 1e-5
    assert fs.hidden.shape == (4, 576)
    assert (
        "E) z" in fs.rows["prompt"][3] and "D) z" in fs.rows["prompt"][2]
    )  # numeric labels shown as letters
    # the same raw log-prob for the same option letter whichever question asks (dummy: per-token draw)
    raw = fs.rows["raw_option_logprobs"].to_list()
    assert raw[3][:3] != raw[1][:3]  # different prompts, different draws
    assert any("wrote smollm2-135m/arc-challenge/none" in s for s in lines)


def test_dummy_facts_all_variants_then_skip(tmp_path, monkeypatch):
    cfg = ExtractConfig(
        model="smollm2-135m",
        dataset="facts",
        backend="dummy",
        size=30,
        store=tmp_path / "s",
        progress=False,
        shard_rows=7,
    )
    paths = run_mod.run(cfg, out=lambda s: None)
    assert [p.parts[-2] for p in paths] == ["none", "relevant", "irrelevant"]
    rows = {p.parts[-2]: read_feature_set(p).rows for p in paths}
    assert rows["irrelevant"]["context_source_id"].null_count() == 0
    assert rows["none"]["context_source_id"].null_count() == 30
    assert rows["relevant"]["prompt"][0] != rows["none"]["prompt"][0]

    def boom(*a, **k):
        raise AssertionError("the model must not be loaded when every feature set is complete")

    monkeypatch.setattr(DUMMY, "load", boom)
    lines, out = _lines()
    assert run_mod.run(cfg, out=out) == paths
    assert sum(s.startswith("already complete: ") for s in lines) == 3


def test_resume_after_interrupt_gives_identical_rows(tmp_path, monkeypatch):
    cfg = ExtractConfig(
        model="smollm2-135m",
        dataset="facts",
        backend="dummy",
        size=40,
        variants=("relevant",),
        store=tmp_path / "s",
        progress=False,
        shard_rows=10,
    )
    calls = {"n": 0}
    orig = DummyBackend.score

    def flaky(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return orig(self, *a, **k)

    monkeypatch.setattr(DummyBackend, "score", flaky)
    with pytest.raises(KeyboardInterrupt):
        run_mod.run(cfg, out=lambda s: None)
    monkeypatch.setattr(DummyBackend, "score", orig)
    lines, out = _lines()
    [path] = run_mod.run(cfg, out=out)
    assert any("resuming" in s and "after 20 durable rows" in s for s in lines)
    fresh = ExtractConfig(**{**cfg.__dict__, "store": tmp_path / "fresh"})
    [path2] = run_mod.run(fresh, out=lambda s: None)
    a, b = read_feature_set(path), read_feature_set(path2)
    assert a.rows.equals(b.rows)
    np.testing.assert_array_equal(np.asarray(a.hidden[:]), np.asarray(b.hidden[:]))


def test_unknown_names_suggest_close_matches(tmp_path):
    with pytest.raises(KeyError, match="unknown model 'smollm2'; did you mean smollm2-135m"):
        run_mod.run(ExtractConfig(model="smollm2", dataset="facts", store=tmp_path), out=lambda s: None)
    with pytest.raises(KeyError, match="unknown dataset 'pubmed'; did you mean"):
        run_mod.run(ExtractConfig(model="smollm2-135m", dataset="pubmed", store=tmp_path), out=lambda s: None)
    with pytest.raises(ValueError, match="has no relevant variant"):
        run_mod.run(
            ExtractConfig(model="smollm2-135m", dataset="mmlu", variants=("relevant",), store=tmp_path),
            out=lambda s: None,
        )


def test_tiny_local_hf_model_end_to_end(tmp_path, monkeypatch):
    """A local HF checkpoint through load_hf_backend (self-check included) into the store."""
    tok = tiny_tokenizer()
    model = tiny_model(len(tok), seed=2)
    mdir = tmp_path / "tiny"
    model.save_pretrained(mdir)
    tok.save_pretrained(mdir)
    models = dict(catalog.load_models())
    models["tiny"] = catalog.ModelEntry(
        name="tiny", source="local", path=str(mdir), hidden_size=32, dtype="float32"
    )
    monkeypatch.setattr(catalog, "load_models", lambda: models)
    rows = [
        {
            "id": f"r{i}",
            "question": q,
            "options": ["oxygen", "helium", "water"][: 2 + i % 2],
            "label": i % 2,
            "context": c,
        }
        for i, (q, c) in enumerate(
            [
                ("Which gas ?", "the sun"),
                ("Is the door red ?", "the moon"),
                ("Is the cat on the mat ?", "a tree"),
                ("Which star ?", "root"),
            ]
        )
    ]
    data = _write_jsonl(
        tmp_path / "mine.jsonl",
        [dict(r, split=s) for r, s in zip(rows, ["val", "val", "test", "test"], strict=True)],
    )
    datasets_ = dict(catalog.load_datasets())
    datasets_["mine"] = catalog.DatasetEntry(
        name="mine", loader="jsonl", split_protocol={"mode": "given"}, has_context=True, prompt="mc_context"
    )
    monkeypatch.setattr(catalog, "load_datasets", lambda: datasets_)
    # --dtype auto measures (here: a fake GEMM probe on which bf16 is emulated and slow) and says why
    monkeypatch.setenv("WALLA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(dtype_probe, "gemm_timing", lambda d, dev: {"float32": 100.0, "bfloat16": 25.0}[d])
    monkeypatch.setattr(dtype_probe, "prior", lambda device: (None, "test: no bf16 features"))
    monkeypatch.setattr(dtype_probe, "PAUSE_S", 0)
    cfg = ExtractConfig(
        model="tiny",
        dataset="mine",
        backend="hf",
        data_file=data,
        store=tmp_path / "s",
        progress=False,
        device="cpu",
        batch_tokens=64,
        dtype="auto",
    )
    lines, out = _lines()
    paths = run_mod.run(cfg, out=out)
    assert len(paths) == 3
    assert any(
        x.startswith(
            "dtype auto -> float32: no feature prior; GEMM probe on cpu (512x512x512, 3 pairs) "
            "bfloat16/float32 0.25, float32 100, bfloat16 25 GFLOP/s, quiet"
        )
        for x in lines
    )
    fs = read_feature_set(paths[0])  # none
    assert fs.meta["inputs"]["dtype"] == "float32"  # the fingerprint records the dtype actually used
    assert fs.rows["n_options"].to_list() == [2, 3, 2, 3]
    ids = tok(fs.rows["prompt"][1])["input_ids"]
    with torch.no_grad():
        own = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    np.testing.assert_allclose(
        np.asarray(fs.hidden[1]).astype(np.float32),
        own.hidden_states[-1][0, -1].numpy(),
        rtol=2e-3,
        atol=2e-3,
    )  # stored as float16
    letters = [tok.convert_tokens_to_ids(x) for x in "ABC"]
    want = torch.log_softmax(own.logits[0, -1, letters], -1).numpy()
    np.testing.assert_allclose(fs.rows["option_logprobs"][1].to_list(), want, atol=1e-5)
    assert fs.rows["n_prompt_tokens"][1] == len(ids)
    irr = read_feature_set(paths[2]).rows
    assert irr["context_source_id"].to_list() == ["r1", "r0", "r3", "r2"]  # same split only


def test_settled_identity_takes_back_exactly_what_inputs_added():
    """walla serve re-settles a model to the identity a feature set recorded (extract/run.py settled_identity):
    the keys `_inputs` adds to the backend's identity are DATA_INPUTS, no more, no fewer."""
    from types import SimpleNamespace

    from walla.extract.prompts import get_template
    from walla.extract.run import DATA_INPUTS, _inputs, settled_identity

    ident = {"backend": "hf", "dtype": "bfloat16", "kernels": {"cpu_capability": "AVX512"}}
    template = get_template("facts")
    d_entry = SimpleNamespace(option_tokens=("Yes", "No"))
    cfg = SimpleNamespace(context_seed=7)
    inputs = _inputs("irrelevant", "qfp", {"hub": {"revision": "abc"}}, ident, d_entry, template, cfg)
    assert set(inputs) - set(ident) == set(DATA_INPUTS)
    assert settled_identity(inputs) == ident
