"""Real-model extraction: the embedded SmolLM2-135M on real PubMedQA questions (CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from walla.extract.config import ExtractConfig
from walla.extract.models import converted_gguf_dir, resolve_model
from walla.extract.run import run
from walla.manifests.catalog import load_models
from walla.store.features import read_feature_set
from walla.store.questions import read_question_table

PQA = Path(__file__).resolve().parents[3] / "shared" / "data" / "pubmedqa" / "ori_pqal.json"


@pytest.mark.slow
@pytest.mark.skipif(not PQA.exists(), reason=f"real PubMedQA file not found at {PQA} (dev machine only)")
def test_smollm2_pubmedqa_three_variants(tmp_path):
    # convert the GGUF once first (20-60 s on a fresh machine), so the extraction below runs on the cached copy
    rm = resolve_model(load_models()["smollm2-135m"])
    converted_gguf_dir(Path(rm.load_from) / rm.gguf_file, rm.identity["gguf_sha256"])
    # 16 real questions (8 yes, 8 no) with the shortest abstracts, in the release's own format (a short test)
    data = json.loads(PQA.read_text())
    by_len = sorted(data, key=lambda k: sum(len(c) for c in data[k]["CONTEXTS"]))
    pick = [k for k in by_len if data[k]["final_decision"] == "yes"][:8]
    pick += [k for k in by_len if data[k]["final_decision"] == "no"][:8]
    subset = tmp_path / "ori_pqal_16.json"
    subset.write_text(json.dumps({k: data[k] for k in pick}))
    cfg = ExtractConfig(
        model="smollm2-135m",
        dataset="pubmedqa-labeled",
        data_file=subset,
        store=tmp_path / "store",
        backend="hf",
        device="cpu",
        progress=False,
    )
    lines: list[str] = []
    paths = run(cfg, out=lines.append)
    q, _ = read_question_table(tmp_path / "store", "pubmedqa-labeled")
    assert q.height == 16
    sets = {p.parts[-2]: read_feature_set(p) for p in paths}
    assert set(sets) == {"none", "relevant", "irrelevant"}
    for variant, fs in sets.items():
        assert fs.hidden.shape == (16, 576), variant
        assert fs.rows["question_id"].to_list() == q["question_id"].to_list()
        h = np.asarray(fs.hidden[:]).astype(np.float32)
        assert np.isfinite(h).all() and np.abs(h).max() > 0
        lp = np.array(fs.rows["option_logprobs"].to_list(), dtype=np.float64)
        np.testing.assert_allclose(np.logaddexp(lp[:, 0], lp[:, 1]), 0.0, atol=1e-5)
        assert (fs.rows["prompt_nll"].to_numpy() > 0).all()
    n_none = sets["none"].rows["n_prompt_tokens"].to_numpy()
    n_rel = sets["relevant"].rows["n_prompt_tokens"].to_numpy()
    assert (n_rel > n_none + 30).all()  # the abstract is in the prompt
    src = sets["irrelevant"].rows["context_source_id"].to_list()
    split = dict(zip(q["question_id"], q["split"], strict=True))
    assert all(s != qid and split[s] == split[qid] for s, qid in zip(src, q["question_id"], strict=True))
    # the relevant and none variants see different prompts, so their hidden states differ
    assert not np.allclose(np.asarray(sets["none"].hidden[:]), np.asarray(sets["relevant"].hidden[:]))
