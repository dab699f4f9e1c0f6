"""Every loader on small fixtures in each supported format, and every malformed-input error."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import datasets
import numpy as np
import pytest
from walla.extract.datasets import DatasetRequest, load_dataset_table
from walla.extract.datasets.facts import TEMPLATES
from walla.extract.splits import SplitProtocol

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
NONE = SplitProtocol("none")


def load(loader, path=None, protocol=NONE, **kw):
    return load_dataset_table(
        DatasetRequest(name="t", loader=loader, data_file=path, split_protocol=protocol, **kw)
    )


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def hub_parquet(tmp_path: Path, rows: list[dict], name="data.parquet") -> Path:
    out = tmp_path / name
    datasets.Dataset.from_list(rows).to_parquet(str(out))
    return out


# ----------------------------------------------------------------------------- PubMedQA

PQA = {
    "101": {
        "QUESTION": "Does X help?",
        "CONTEXTS": ["Bg text.", "We did Y."],
        "LABELS": ["BACKGROUND", "METHODS"],
        "final_decision": "yes",
        "LONG_ANSWER": "It does.",
    },
    "102": {
        "QUESTION": "Is Z safe?",
        "CONTEXTS": ["Only one."],
        "LABELS": ["OBJECTIVE"],
        "final_decision": "no",
        "LONG_ANSWER": "No.",
    },
    "103": {
        "QUESTION": "Maybe?",
        "CONTEXTS": ["c"],
        "LABELS": ["RESULTS"],
        "final_decision": "maybe",
        "LONG_ANSWER": "?",
    },
}


def test_pubmedqa_original(tmp_path):
    p = tmp_path / "ori_pqal.json"
    p.write_text(json.dumps(PQA))
    df, src = load("pubmedqa", p)
    assert df["question_id"].to_list() == ["101", "102"]
    assert df["context"][0] == "(Background) Bg text.\n(Methods) We did Y."
    assert df["label"].to_list() == [0, 1] and df["options"][0].to_list() == ["yes", "no"]
    assert df["option_labels"][0].to_list() == ["YES", "NO"]
    assert src["dropped"] == {"final_decision 'maybe'": 1}


def test_pubmedqa_hub_format(tmp_path):
    rows = [
        {
            "pubid": int(k),
            "question": v["QUESTION"],
            "long_answer": v["LONG_ANSWER"],
            "final_decision": v["final_decision"],
            "context": {"contexts": v["CONTEXTS"], "labels": v["LABELS"], "meshes": ["m"]},
        }
        for k, v in PQA.items()
    ]
    df, src = load("pubmedqa", hub_parquet(tmp_path, rows))
    assert df.height == 2 and df["context"][1] == "(Objective) Only one."
    # the same rows saved with save_to_disk (a DatasetDict with the configured split)
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "saved"))
    df2, _ = load("pubmedqa", tmp_path / "saved", hub={"path": "qiaojin/PubMedQA", "split": "train"})
    assert df2.equals(df)


def test_pubmedqa_missing_field(tmp_path):
    bad = {"7": {"QUESTION": "q", "final_decision": "yes"}}
    p = tmp_path / "ori.json"
    p.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"ori\.json, entry '7': missing field 'CONTEXTS'"):
        load("pubmedqa", p)


# ----------------------------------------------------------------------------- MedMCQA

MED = [
    {
        "id": "a",
        "question": "Q1?",
        "opa": "w",
        "opb": "x",
        "opc": "y",
        "opd": "z",
        "cop": 1,
        "subject_name": "Anatomy",
    },
    {
        "id": "b",
        "question": "Q2?",
        "opa": "w",
        "opb": "",
        "opc": "y",
        "opd": "z",
        "cop": 3,
        "subject_name": "Physio",
    },
    {"id": "c", "question": "Q3?", "opa": "w", "opb": "x", "opc": "y", "opd": "z", "cop": 0},
    {"id": "d", "question": "Q4?", "opa": "w", "opb": "x", "opc": "y", "opd": "z", "cop": 5},
]


def test_medmcqa_original_is_one_based(tmp_path):
    df, src = load("medmcqa", write_jsonl(tmp_path / "dev.json", MED))
    assert df["question_id"].to_list() == ["a", "b"]
    assert df["label"].to_list() == [0, 1]  # b: cop 3 = opc, which is option 1 after dropping the empty opb
    assert df["options"][1].to_list() == ["w", "y", "z"] and df["option_labels"][1].to_list() == [
        "A",
        "C",
        "D",
    ]
    assert sum(src["dropped"].values()) == 2  # cop 0 and 5 are not valid 1-based answers


def test_medmcqa_hub_is_zero_based(tmp_path):
    rows = [
        dict(r, cop=c, exp=None, topic_name=None, choice_type="single", subject_name="s")
        for r, c in zip(MED, [0, 2, -1, 3], strict=True)
    ]
    df, src = load("medmcqa", hub_parquet(tmp_path, rows))
    assert df["label"].to_list() == [0, 1, 3] and src["dropped"] == {"cop -1 not a valid 0-based answer": 1}


def test_medmcqa_missing_cop(tmp_path):
    p = write_jsonl(
        tmp_path / "m.jsonl", [{"id": "x", "question": "q", "opa": "a", "opb": "b", "opc": "c", "opd": "d"}]
    )
    with pytest.raises(ValueError, match=r"m\.jsonl, line 1: missing field 'cop'"):
        load("medmcqa", p)


# ----------------------------------------------------------------------------- MMLU


def _csv(path: Path, rows: list[list]) -> Path:
    with path.open("w", newline="") as f:
        csv.writer(f).writerows(rows)
    return path


def test_mmlu_original_csvs(tmp_path):
    d = tmp_path / "mmlu"
    d.mkdir()
    _csv(
        d / "anatomy_test.csv", [["What, really?", "a", "b", "c", "d", "C"], ["Q2", "a", "b", "c", "d", "A"]]
    )
    _csv(
        d / "virology_dev.csv",
        [["question", "choice0", "choice1", "choice2", "choice3", "answer"], ["Q3", "a", "b", "c", "d", "3"]],
    )
    df, src = load("mmlu", d)
    assert df["label"].to_list() == [2, 0, 3]
    assert df["subject"].to_list() == ["anatomy", "anatomy", "virology"]
    assert df["question"][0] == "What, really?" and src["files"] == 2


def test_mmlu_hub_format_and_nested_aux(tmp_path):
    rows = [{"question": "Q", "subject": "astronomy", "choices": ["a", "b", "c", "d"], "answer": 1}]
    df, _ = load("mmlu", hub_parquet(tmp_path, rows))
    assert df["label"].to_list() == [1] and df["subject"][0] == "astronomy"
    nested = [{"train": {"question": "Q", "subject": "", "choices": ["a", "b", "c", "d"], "answer": 2}}]
    df2, _ = load("mmlu", hub_parquet(tmp_path, nested, "aux.parquet"))
    assert df2["label"].to_list() == [2] and df2["subject"][0] is None


def test_mmlu_answer_out_of_range(tmp_path):
    p = _csv(tmp_path / "x_dev.csv", [["Q", "a", "b", "c", "d", "A"], ["Q2", "a", "b", "c", "d", "4"]])
    with pytest.raises(ValueError, match=r"x_dev\.csv, line 2: answer index 4 is out of range for 4 options"):
        load("mmlu", p)


# ----------------------------------------------------------------------------- ARC


def _arc(i, labels, key):
    return {
        "id": f"q{i}",
        "question": {"stem": f"Stem {i}?", "choices": [{"text": f"t{lab}", "label": lab} for lab in labels]},
        "answerKey": key,
    }


ARC = [_arc(0, "ABCD", "B"), _arc(1, "ABC", "C"), _arc(2, "1234", "4"), _arc(3, "ABCDE", "E")]


def test_arc_original_keeps_odd_rows(tmp_path):
    df, _ = load("arc", write_jsonl(tmp_path / "arc.jsonl", ARC))
    assert df.height == 4  # the reference drops rows 1-3; we keep them
    assert df["options"].list.len().to_list() == [4, 3, 4, 5]
    assert df["label"].to_list() == [1, 2, 3, 4]
    assert df["option_labels"][2].to_list() == ["1", "2", "3", "4"]
    assert set(df["split"]) == {"test"}


def test_arc_hub_format(tmp_path):
    rows = [
        {
            "id": r["id"],
            "question": r["question"]["stem"],
            "answerKey": r["answerKey"],
            "choices": {
                "text": [c["text"] for c in r["question"]["choices"]],
                "label": [c["label"] for c in r["question"]["choices"]],
            },
        }
        for r in ARC
    ]
    # a parquet file is a hub export even where the manifest says local_format: original
    df, _ = load("arc", hub_parquet(tmp_path, rows), local_format="original")
    assert df["label"].to_list() == [1, 2, 3, 4] and df["question"][3] == "Stem 3?"
    df2, _ = load(
        "arc", write_jsonl(tmp_path / "hub.jsonl", rows), local_format="hub"
    )  # hub rows as JSON lines
    assert df2.equals(df)


def test_arc_errors(tmp_path):
    bad = [ARC[0], {"id": "z", "question": {"stem": "s", "choices": [{"text": "a", "label": "A"}]}}]
    with pytest.raises(ValueError, match=r"arc\.jsonl, line 2: missing field 'answerKey'"):
        load("arc", write_jsonl(tmp_path / "arc.jsonl", bad))
    with pytest.raises(ValueError, match=r"line 1: field 'answerKey' 'F' is not one of the choice labels"):
        load("arc", write_jsonl(tmp_path / "arc2.jsonl", [_arc(0, "ABCD", "F")]))
    with pytest.raises(ValueError, match=r"line 1: field 'choices' is empty"):
        load("arc", write_jsonl(tmp_path / "arc3.jsonl", [_arc(0, "", "A")]))
    with pytest.raises(ValueError, match=r"line 2: duplicate id 'q0' \(first seen at .*line 1\)"):
        load("arc", write_jsonl(tmp_path / "arc4.jsonl", [ARC[0], ARC[0]]))
    with pytest.raises(ValueError, match=r"line 1: not valid JSON"):
        (tmp_path / "arc5.jsonl").write_text("{oops\n")
        load("arc", tmp_path / "arc5.jsonl")


# ----------------------------------------------------------------------------- generic JSON lines

GENERIC = [
    {"id": 1, "question": "Q1", "options": ["a", "b", "c"], "label": 2, "context": "ctx1", "subject": "s"},
    {
        "id": 2,
        "question": "Q2",
        "options": ["a", "b"],
        "label": "B",
        "context": "ctx2",
        "gold_dist": [0.3, 0.7],
    },
]


def test_jsonl_generic(tmp_path):
    rows = [*GENERIC, dict(GENERIC[0], id=3)]
    df, _ = load(
        "jsonl", write_jsonl(tmp_path / "g.jsonl", rows), SplitProtocol("uniform", (0.4, 0.3, 0.3), 1)
    )
    assert df["question_id"].to_list() == ["1", "2", "3"] and df["label"].to_list() == [2, 1, 2]
    assert df["gold_dist"][1].to_list() == [0.3, 0.7] and df["gold_dist"][0] is None
    assert sorted(df["split"].to_list()) == ["test", "train", "val"]
    given = [dict(r, split=s) for r, s in zip(rows, ["val", "train", "test"], strict=True)]
    df2, src = load("jsonl", write_jsonl(tmp_path / "g2.jsonl", given), SplitProtocol("uniform"))
    assert df2["split"].to_list() == ["val", "train", "test"] and src["split_protocol"]["mode"] == "given"


def test_empty_val_or_test_split_is_refused(tmp_path):
    path = write_jsonl(tmp_path / "g.jsonl", GENERIC)
    with pytest.raises(ValueError, match=r"1 train / 0 val / 1 test rows; need >= 1 val and >= 1 test row"):
        load("jsonl", path, SplitProtocol("uniform", (0.5, 0.0, 0.5), 1))
    given = [dict(r, split=s) for r, s in zip(GENERIC, ["val", "train"], strict=True)]
    with pytest.raises(ValueError, match=r"1 train / 1 val / 0 test rows"):
        load("jsonl", write_jsonl(tmp_path / "g2.jsonl", given))
    assert load("jsonl", path, NONE)[0].height == 2  # split mode none (evaluation only): all test, allowed


def test_generated_too_small_names_the_minimum_size():
    """Issue 12 #3: `--size 3` of facts made 2 train / 0 val / 0 test rows without a word."""
    balanced = SplitProtocol("balanced_binary", (0.8, 0.1, 0.1), 42)
    with pytest.raises(ValueError, match=r"2 train / 0 val / 0 test rows.*\(--size 14 is the minimum\)"):
        load("facts", generator={"n": 3, "seed": 7}, protocol=balanced)
    with pytest.raises(ValueError, match=r"--size 14 is the minimum"):
        load("facts", generator={"n": 13, "seed": 7}, protocol=balanced)
    df, _ = load("facts", generator={"n": 14, "seed": 7}, protocol=balanced)
    assert sorted(set(df["split"].to_list())) == ["test", "train", "val"]


def test_generated_refuses_data_file(tmp_path):
    """Issue 12 #5: --data-file with a generated dataset was silently ignored."""
    for loader in ("facts", "bayesx"):
        with pytest.raises(ValueError, match=rf"'t' is generated \({loader} generator\).*drop --data-file"):
            load(loader, tmp_path / "x.jsonl", generator={"n": 50})


@pytest.mark.parametrize(
    ("row", "msg"),
    [
        ({"id": 3, "question": "Q", "options": ["a", "b"]}, r"line 3: missing field 'label'"),
        (
            {"id": 3, "question": "Q", "options": [], "label": 0},
            r"line 3: field 'options' needs at least 2 options, got 0",
        ),
        (
            {"id": 3, "question": "Q", "options": ["a", "b"], "label": 2},
            r"line 3: answer index 2 is out of range for 2 options",
        ),
        (
            {"id": 3, "question": "Q", "options": ["a", "b"], "label": "C"},
            r"line 3: field 'label' 'C' is not one of",
        ),
        ({"id": 1, "question": "Q", "options": ["a", "b"], "label": 0}, r"line 3: duplicate id '1'"),
        (
            {"id": 3, "question": "Q", "options": ["a", "b"], "label": 0, "split": "dev"},
            r"line 3: field 'split' is 'dev'",
        ),
        (
            {"id": 3, "question": "Q", "options": ["a", "b"], "label": 0, "gold_dist": [0.5, 0.6]},
            r"line 3: field 'gold_dist' must be 2 non-negative numbers summing to 1",
        ),
        ({"id": 3, "question": "", "options": ["a", "b"], "label": 0}, r"line 3: field 'question' is empty"),
    ],
)
def test_jsonl_malformed(tmp_path, row, msg):
    p = write_jsonl(tmp_path / "bad.jsonl", [*GENERIC, row])
    with pytest.raises(ValueError, match=msg):
        load("jsonl", p)


def test_unknown_loader_and_missing_file(tmp_path):
    with pytest.raises(KeyError, match="unknown dataset loader 'nope'"):
        load("nope")
    with pytest.raises(ValueError, match="does not exist"):
        load("arc", tmp_path / "missing.jsonl")


# ----------------------------------------------------------------------------- generated datasets


def test_bayesx_generator():
    df, src = load(
        "bayesx",
        generator={"n": 400, "seed": 42},
        protocol=SplitProtocol("balanced_binary", (0.8, 0.1, 0.1), 18),
    )
    post = np.array([g[0] for g in df["gold_dist"].to_list()])
    assert ((post > 0.5) == (df["label"].to_numpy() == 0)).all()  # option 0 is '1' (SPEC §10.7 fixed)
    assert df["options"][0].to_list() == ["1", "0"]
    low_prior = df["question"].str.contains("P\\(S=1\\)= 0.10").to_numpy()
    assert (post[low_prior] >= 0.5).all() and (post[low_prior] <= 0.69).all()  # evidence flips the prior
    assert (post[~low_prior] <= 0.5).all() and (post[~low_prior] >= 0.31).all()
    assert (df["label"] == 0).sum() == (df["label"] == 1).sum()  # balanced
    assert df["context"][0].startswith("Update Rule:") and "$W=$" in df["context"][0]
    df2, _ = load(
        "bayesx", generator={"n": 400, "seed": 42}, protocol=SplitProtocol("balanced_binary", seed=18)
    )
    assert df.equals(df2)


def test_facts_generator():
    df, _ = load("facts", generator={"n": 101, "seed": 3}, protocol=SplitProtocol("uniform"))
    assert df.height == 101 and df["question_id"].n_unique() == 101
    assert abs(int((df["label"] == 0).sum()) - int((df["label"] == 1).sum())) <= 1
    for q, c, lab in zip(df["question"], df["context"], df["label"], strict=True):
        e = re.search(r"\d+", c).group()
        fact_t, q_t, words = next(
            t for t in TEMPLATES if any(c == t[0].format(e=e, v=v) for v in t[2].split())
        )
        values = words.split()
        value = next(v for v in values if c == fact_t.format(e=e, v=v))
        assert (q == q_t.format(e=e, v=value)) == (lab == 0), (
            q,
            c,
            lab,
        )  # "yes" rows ask the fact's own value
        assert q in {q_t.format(e=e, v=v) for v in values}
    with pytest.raises(ValueError, match="unknown parameters"):
        load("facts", generator={"n": 10, "sed": 1})


# ----------------------------------------------------------------------------- the real development files


@pytest.mark.skipif(not SHARED.exists(), reason=f"real data not found at {SHARED} (only on the dev machine)")
def test_real_files_load():
    arc, _ = load("arc", SHARED / "arc" / "ARC-Challenge-Dev.jsonl")
    assert arc.height == 299 and sorted(set(arc["options"].list.len())) == [3, 4, 5]
    med, src = load("medmcqa", SHARED / "medmcqa" / "dev-sample-300.jsonl")
    assert med.height + sum(src["dropped"].values()) == 300
    mmlu, _ = load("mmlu", SHARED / "mmlu" / "dev")
    assert mmlu.height == 285 and mmlu["subject"].n_unique() == 57
    pqa, src = load("pubmedqa", SHARED / "pubmedqa" / "ori_pqal.json")
    assert pqa.height == 890 and src["dropped"] == {"final_decision 'maybe'": 110}
