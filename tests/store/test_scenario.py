from __future__ import annotations

import dataclasses
import json
import time

import numpy as np
import polars as pl
import pytest
import walla.store.scenario._assemble as scenario_mod
import walla.store.scenario._sources as parts_mod
from hypothesis import given, settings
from hypothesis import strategies as st
from store_fixtures import build_store, make_questions, make_rows, write_feature_set
from walla.manifests.catalog import DatasetEntry, ModelEntry
from walla.manifests.scenario import Scenario, ScenarioSpec
from walla.store.features import (
    FeatureSetSpec,
    StaleSchemaError,
    StoreError,
    list_feature_sets,
    open_writer,
)
from walla.store.questions import write_question_table
from walla.store.scenario import _routing as routing
from walla.store.schema import VARIANT_CODE

NONE, REL, IRR = VARIANT_CODE["none"], VARIANT_CODE["relevant"], VARIANT_CODE["irrelevant"]
DATASETS = {
    "toy": DatasetEntry(name="toy", loader="jsonl", split_protocol={"mode": "uniform"}, has_context=True),
    "soft": DatasetEntry(
        name="soft",
        loader="bayesx",
        split_protocol={"mode": "uniform"},
        option_tokens=["1", "0"],
        soft_target=True,
        has_context=True,
        generator={"n": 1},
    ),
    "ood": DatasetEntry(name="ood", loader="arc", split_protocol={"mode": "none"}),
}
TAGS = {"aloe": 1, "gemma2": 2, "llama3.1": 3}


def _entry(agents, rule="none", dataset="toy", eval_dataset=None, seed=7):
    return ScenarioSpec(
        name="t",
        dataset=dataset,
        agents=tuple(agents),
        description="test",
        context_rule=rule,
        context_seed=seed,
        eval_dataset=eval_dataset,
    )


def _check_sources(data, part_offset=0):
    """Each hidden row carries (variant, question index, model) tags: check the router put the right row there."""
    for s, a in enumerate(data.agents):
        h = data.hidden[s].astype(np.float32)  # [N, H]
        np.testing.assert_array_equal(h[:, 0], data.variant[:, s])
        np.testing.assert_array_equal(h[:, 3], TAGS[a])
    return True


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 200), m=st.integers(2, 12), seed=st.integers(0, 2**31), irr=st.booleans())
def test_assignment_is_balanced_and_valid(n, m, seed, irr):
    rule = "one_relevant_one_irrelevant" if irr else "one_relevant"
    v = routing.assign_split(n, m, rule, np.random.default_rng(seed))  # [n, M]
    assert ((v == REL).sum(1) == 1).all()  # exactly one relevant agent per question
    rel_counts = (v == REL).sum(0)
    assert rel_counts.max() - rel_counts.min() <= 1 and rel_counts.sum() == n
    if irr:
        assert ((v == IRR).sum(1) == 1).all()
        irr_counts = (v == IRR).sum(0)
        assert irr_counts.max() - irr_counts.min() <= 1
    else:
        assert not (v == IRR).any()
    np.testing.assert_array_equal(v, routing.assign_split(n, m, rule, np.random.default_rng(seed)))


def test_assignment_independent_per_split_and_seeded():
    split = np.array(["train"] * 50 + ["val"] * 7 + ["test"] * 9)
    a = routing.assign(split, 4, "one_relevant", seed=3)
    b = routing.assign(np.concatenate([split, ["val"] * 5]), 4, "one_relevant", seed=3)
    np.testing.assert_array_equal(a[:50], b[:50])  # adding val rows leaves train's assignment alone
    np.testing.assert_array_equal(a[57:], b[57:66])
    assert not np.array_equal(a, routing.assign(split, 4, "one_relevant", seed=4))
    assert (routing.assign(split, 4, "none", seed=3) == NONE).all()
    counts = routing.assignment_counts(split, a)
    assert counts["train"]["relevant"] == [13, 13, 12, 12] or sorted(counts["train"]["relevant"]) == [
        12,
        12,
        13,
        13,
    ]


def test_homogeneous_reads_two_feature_sets(tmp_path, monkeypatch):
    q = make_questions(120, k_min=2, k_max=2)
    build_store(
        tmp_path, "toy", q, {"aloe": 1}, ["none", "relevant", "irrelevant"], chunk_rows=16, prompt=True
    )
    opened = []
    orig = parts_mod.read_feature_set
    monkeypatch.setattr(parts_mod, "read_feature_set", lambda p, **kw: opened.append(p) or orig(p, **kw))
    data = scenario_mod.assemble_scenario(
        Scenario(_entry(["aloe"] * 8, "one_relevant"), {}, DATASETS), tmp_path
    )
    assert len(opened) == 2 and {p.parent.name for p in opened} == {"none", "relevant"}  # not 8, not 3
    assert set(data.fingerprints) == {"aloe/none", "aloe/relevant"}
    n, m = 120, 8
    assert data.probs.shape == (n, m, 2) and len(data.hidden) == m and data.hidden[0].shape == (n, 8)
    assert ((data.variant == REL).sum(1) == 1).all() and not (data.variant == IRR).any()
    for s in ("train", "val", "test"):  # balanced within each split
        c = (data.variant[data.split == s] == REL).sum(0)
        assert c.max() - c.min() <= 1
    assert (
        data.meta["assignment"]["train"]["relevant"]
        == (data.variant[data.split == "train"] == REL).sum(0).tolist()
    )
    _check_sources(data)
    # question order and the question index tag agree (fs rows are in question-table order here)
    qidx = data.hidden[0][:, 1].astype(np.int64) + 2048 * data.hidden[0][:, 2].astype(np.int64)
    np.testing.assert_array_equal(data.question_id, np.array(q["question_id"].to_list())[qidx])
    # probs = softmax of the chosen variant's option_logprobs; prompt_nll likewise; prompts filled
    rows = {v: make_rows(q, v, model_tag=1, prompt=True)[0] for v in ("none", "relevant")}
    for s in range(m):
        for v, code in (("none", NONE), ("relevant", REL)):
            sel = data.variant[:, s] == code
            lp = np.array(rows[v]["option_logprobs"].to_list())[sel]
            np.testing.assert_allclose(
                data.probs[sel, s], np.exp(lp) / np.exp(lp).sum(1, keepdims=True), rtol=1e-5
            )
            np.testing.assert_allclose(data.prompt_nll[sel, s], rows[v]["prompt_nll"].to_numpy()[sel])
            assert all(data.prompts[s][i].startswith(f"[{v}]") for i in np.flatnonzero(sel))
    np.testing.assert_allclose(data.probs.sum(-1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(data.target.argmax(1), data.label)
    assert not data.soft_target and data.dataset == "toy" and data.agents == ["aloe"] * 8
    again = scenario_mod.assemble_scenario(
        Scenario(_entry(["aloe"] * 8, "one_relevant"), {}, DATASETS), tmp_path
    )
    np.testing.assert_array_equal(again.variant, data.variant)  # reproducible
    assert all(np.array_equal(a, b) for a, b in zip(again.hidden, data.hidden, strict=True))


def test_irrelevant_context_and_variable_options(tmp_path):
    q = make_questions(200, k_min=3, k_max=5)
    build_store(
        tmp_path, "toy", q, {"aloe": 1, "gemma2": 2}, ["none", "relevant", "irrelevant"], chunk_rows=16
    )
    entry = _entry(["gemma2", "aloe", "aloe", "gemma2"], "one_relevant_one_irrelevant")
    data = scenario_mod.assemble_scenario(Scenario(entry, {}, DATASETS), tmp_path)
    assert ((data.variant == REL).sum(1) == 1).all() and ((data.variant == IRR).sum(1) == 1).all()
    assert not ((data.variant == REL) & (data.variant == IRR)).any()
    _check_sources(data)
    assert data.probs.shape[2] == 5
    np.testing.assert_array_equal(data.option_mask.sum(1), data.n_options)
    assert (data.probs[~np.repeat(data.option_mask[:, None, :], 4, axis=1)] == 0).all()  # nothing beyond K_q
    np.testing.assert_allclose(data.probs.sum(-1), 1.0, rtol=1e-6)
    # the irrelevant context of each question came from another question of the same split
    qt = q.select("question_id", "split")
    split_of = dict(zip(qt["question_id"], qt["split"], strict=True))
    for info in list_feature_sets(tmp_path, variant="irrelevant"):
        rows = pl.read_parquet(info.path / "rows.parquet")
        for qid, src in zip(rows["question_id"], rows["context_source_id"], strict=True):
            assert src != qid and split_of[src] == split_of[qid]
    assert set(data.fingerprints) == {
        f"{m}/{v}" for m in ("aloe", "gemma2") for v in ("none", "relevant", "irrelevant")
    }


def test_irrelevant_from_another_split_is_rejected(tmp_path):
    q = make_questions(60)
    qfp = build_store(tmp_path, "toy", q, {"aloe": 1}, ["none", "relevant"])
    rows, hidden = make_rows(q, "irrelevant", model_tag=1)
    split = q["split"].to_list()
    other = {
        s: next(qid for qid, sp in zip(q["question_id"], split, strict=True) if sp != s) for s in set(split)
    }
    bad = rows.with_columns(context_source_id=pl.Series([other[s] for s in split]))
    with open_writer(
        tmp_path, FeatureSetSpec("aloe", "toy", "irrelevant", {"questions_fp": qfp, "model_tag": 1}), 8, 60
    ) as w:
        w.write_shard(bad, hidden)
        w.commit()
    with pytest.raises(StoreError, match="must come from another question of the same split"):
        scenario_mod.assemble_scenario(
            Scenario(_entry(["aloe"] * 3, "one_relevant_one_irrelevant"), {}, DATASETS), tmp_path
        )


def test_missing_incomplete_and_stale_feature_sets(tmp_path):
    q = make_questions(40)
    qfp = build_store(tmp_path, "toy", q, {"aloe": 1}, ["none"])
    with pytest.raises(StoreError) as err:
        scenario_mod.assemble_scenario(
            Scenario(_entry(["aloe", "gemma2"], "one_relevant"), {}, DATASETS), tmp_path
        )
    msg = str(err.value)
    assert f"walla extract --model aloe --dataset toy --variants relevant --store {tmp_path}" in msg
    assert f"walla extract --model gemma2 --dataset toy --variants none,relevant --store {tmp_path}" in msg
    rows, hidden = make_rows(q, "relevant", model_tag=1)
    with open_writer(
        tmp_path, FeatureSetSpec("aloe", "toy", "relevant", {"questions_fp": qfp, "model_tag": 1}), 8, 40
    ) as w:
        w.write_shard(rows[:10], hidden[:10])
    with pytest.raises(StoreError, match=r"relevant: incomplete, 10/40 rows .*this resumes it"):
        scenario_mod.assemble_scenario(
            Scenario(_entry(["aloe", "aloe"], "one_relevant"), {}, DATASETS), tmp_path
        )
    none_fs = next(i for i in list_feature_sets(tmp_path) if i.variant == "none")
    meta = json.loads((none_fs.path / "meta.json").read_text())
    (none_fs.path / "meta.json").write_text(json.dumps({**meta, "schema_version": 0}))
    with pytest.raises(StaleSchemaError, match="only schema v0"):
        scenario_mod.assemble_scenario(Scenario(_entry(["aloe"]), {}, DATASETS), tmp_path)


def test_ood_scenario(tmp_path):
    q = make_questions(80, k_min=2, k_max=3)
    e = make_questions(30, k_min=4, k_max=5, context=False, prefix="e", seed=5)
    build_store(tmp_path, "toy", q, {"aloe": 1, "llama3.1": 3}, ["none"])
    build_store(tmp_path, "ood", e, {"aloe": 1, "llama3.1": 3}, ["none"])
    data = scenario_mod.assemble_scenario(
        Scenario(_entry(["llama3.1", "aloe"], eval_dataset="ood"), {}, DATASETS), tmp_path
    )
    n_in = int(q["split"].is_in(["train", "val"]).sum())
    assert len(data.split) == n_in + 30 and data.dataset == "toy+ood"
    assert set(data.split[:n_in]) <= {"train", "val"} and (data.split[n_in:] == "test").all()
    assert all(x.startswith("e") for x in data.question_id[n_in:]) and not any(
        x.startswith("e") for x in data.question_id[:n_in]
    )
    assert data.probs.shape == (n_in + 30, 2, 5) and data.option_mask[:n_in, 3:].sum() == 0
    assert set(data.fingerprints) == {"aloe/none", "llama3.1/none", "aloe/ood/none", "llama3.1/ood/none"}
    _check_sources(data)
    assert data.meta["parts"] == [
        {"dataset": "toy", "offset": 0, "n": n_in},
        {"dataset": "ood", "offset": n_in, "n": 30},
    ]


def test_soft_targets_newest_choice_and_reordered_rows(tmp_path):
    q = make_questions(50, soft=True)
    qfp = build_store(tmp_path, "soft", q, {"aloe": 1}, ["none"])
    time.sleep(0.01)
    # a second, newer complete "none" feature set (other inputs) whose rows are stored in reverse order
    rows, hidden = make_rows(q, "none", model_tag=1)
    spec = FeatureSetSpec("aloe", "soft", "none", {"questions_fp": qfp, "model_tag": 1, "backend": "other"})
    with open_writer(tmp_path, spec, 8, 50) as w:
        w.write_shard(rows.reverse(), hidden[::-1])
        w.commit()
    data = scenario_mod.assemble_scenario(
        Scenario(_entry(["aloe", "aloe"], dataset="soft"), {}, DATASETS), tmp_path
    )
    assert data.fingerprints["aloe/none"] == spec.fingerprint
    assert any("2 complete feature sets; using " + spec.fingerprint in n for n in data.meta["notes"])
    qidx = data.hidden[0][:, 1].astype(np.int64)
    np.testing.assert_array_equal(data.question_id, np.array(q["question_id"].to_list())[qidx])
    assert data.soft_target
    np.testing.assert_allclose(data.target, np.array(q["gold_dist"].to_list()), rtol=1e-6)
    assert data.prompts is None


def test_hidden_size_checked_against_models_table(tmp_path):
    q = make_questions(20)
    build_store(tmp_path, "toy", q, {"aloe": 1}, ["none"])
    models = {
        "aloe": ModelEntry(
            name="aloe", source="hub", hidden_size=4096, hub_id="HPAI-BSC/Llama3-Aloe-8B-Alpha"
        )
    }
    with pytest.raises(StoreError, match="has hidden size 8, expected 4096 for model 'aloe'"):
        scenario_mod.assemble_scenario(Scenario(_entry(["aloe"]), models, DATASETS), tmp_path)
    models["aloe"] = dataclasses.replace(models["aloe"], hidden_size=8)
    assert scenario_mod.assemble_scenario(Scenario(_entry(["aloe"]), models, DATASETS), tmp_path).hidden[
        0
    ].shape == (20, 8)


def test_feature_sets_from_different_question_tables_are_refused(tmp_path):
    q = make_questions(30)
    qfp = build_store(tmp_path, "toy", q, {"aloe": 1}, ["none"])
    q2 = q.with_columns(question=pl.col("question") + " (v2)")
    qfp2 = write_question_table(tmp_path, "toy", q2, {})
    assert qfp2 != qfp
    write_feature_set(tmp_path, "aloe", "toy", "relevant", q2, qfp2, model_tag=1)
    with pytest.raises(StoreError, match="different question tables"):
        scenario_mod.assemble_scenario(
            Scenario(_entry(["aloe", "aloe"], "one_relevant"), {}, DATASETS), tmp_path
        )
