"""Prompt templates (SPEC §1) and the variant rendering."""

from __future__ import annotations

import polars as pl
import pytest
from walla.extract.prompts import build_prompts, derangement_sources, get_template, option_strings, render


def test_mc_template_exact_text():
    text = render(get_template("mc"), "  Which gas?  ", ["oxygen", "carbon dioxide", "helium"])
    assert text == (
        "Return the label of the correct answer for the question below.\n\n"
        "Question: Which gas?\nChoices:\nA) oxygen\nB) carbon dioxide\nC) helium\nAnswer:"
    )
    assert option_strings(get_template("mc"), 5) == ["A", "B", "C", "D", "E"]


def test_pubmedqa_templates_exact_text():
    t = get_template("pubmedqa")
    assert (
        render(t, "Does X help?", ["yes", "no"]) == "Question:\nDoes X help?\nAnswer with YES or NO. Answer:"
    )
    assert render(t, "Does X help?", ["yes", "no"], "(Background) b") == (
        "Question:\nDoes X help?\nYou are an expert in medical science and you have classified access to the "
        "following context.\nContext:\n(Background) b\nAnswer with YES or NO. Answer:"
    )
    assert option_strings(t, 2) == ["YES", "NO"]
    assert render(t, "Q", ["yes", "no"], description="Be brief.").startswith("Be brief.\n\nQuestion:")


def test_bayesx_prompts_end_with_otherwise():
    t = get_template("bayesx")
    none = render(t, "Prior P(S=1)= 0.10.", ["1", "0"])
    full = render(
        t, "Prior P(S=1)= 0.10.", ["1", "0"], "Update Rule:... Evidence:The monitoring agent outputs $W=$ 1."
    )
    assert none.endswith("or 0 otherwise.") and full.endswith("or 0 otherwise.")
    assert (
        "Based on this empirical probability, answer the following question.\nQuestion: Is it more likely"
        in none
    )
    assert "\nQuestion:It is more likely than not" in full and "Evidence:" in full and "Evidence:" not in none
    assert option_strings(t, 2) == ["1", "0"]


def test_derangement_same_split_no_fixed_points():
    splits = ["train"] * 9 + ["test"] * 5 + ["val"] * 1
    src = derangement_sources([str(i) for i in range(15)], splits, [True] * 15, seed=3)
    for i, j in enumerate(src):
        assert j != i
        if splits[i] != "val":
            assert splits[j] == splits[i]
    assert sorted(src[:9]) == list(range(9))  # a permutation within the split
    assert src == derangement_sources([str(i) for i in range(15)], splits, [True] * 15, seed=3)


def _table():
    return pl.DataFrame(
        {
            "question_id": ["a", "b", "c", "d"],
            "split": ["train", "train", "test", "test"],
            "question": ["Qa", "Qb", "Qc", "Qd"],
            "options": [["y", "n"]] * 4,
            "option_labels": [["YES", "NO"]] * 4,
            "label": [0, 1, 0, 1],
            "gold_dist": [None] * 4,
            "context": ["ca", "cb", "cc", "cd"],
            "subject": [None] * 4,
        }
    )


def test_build_prompts_variants():
    t = get_template("pubmedqa")
    rel = build_prompts(_table(), t, "relevant")
    assert "ca" in rel[0].text and rel[0].context_source_id is None
    irr = build_prompts(_table(), t, "irrelevant", seed=1)
    assert [p.context_source_id for p in irr] == ["b", "a", "d", "c"]
    assert "Context:\ncb\n" in irr[0].text and "Context:\nca\n" in rel[0].text
    assert [p.options for p in irr] == [["YES", "NO"]] * 4
    with pytest.raises(ValueError, match="not available for prompt template 'mc'"):
        build_prompts(_table(), get_template("mc"), "relevant")
    with pytest.raises(ValueError, match="needs a context on every question"):
        build_prompts(_table().with_columns(pl.lit(None, pl.String).alias("context")), t, "relevant")
