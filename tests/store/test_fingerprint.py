from pathlib import Path

import numpy as np
import pytest
from walla.store.features import FeatureSetSpec
from walla.store.fingerprint import canonical_json, fingerprint

GOLDEN_INPUTS = {
    "model": {"hub_id": "HPAI-BSC/Llama3-Aloe-8B-Alpha", "revision": "main"},
    "backend": {"name": "hf", "version": "4.57.0"},
    "dtype": "float32",
    "dataset": {"source": "qiaojin/PubMedQA", "split": "train", "questions_fp": "0123456789abcdef"},
    "prompt_template": "Question:\n{question}\nAnswer with YES or NO. Answer:",
    "variant": "none",
    "option_tokens": ["YES", "NO"],
    "max_length": None,
}


def test_golden_value():
    # If this fails, every existing store is re-keyed: only change it together with FEATURE_SCHEMA_VERSION.
    assert fingerprint(GOLDEN_INPUTS) == "622a22005cf78d5a"
    assert fingerprint({}) == "44136fa355b3678a"  # = sha256(b"{}")[:16]
    assert canonical_json({"b": (1, 2.5), "a": Path("x/y")}) == '{"a":"x/y","b":[1,2.5]}'


def test_key_order_irrelevant():
    shuffled = dict(reversed(list(GOLDEN_INPUTS.items())))
    shuffled["dataset"] = dict(reversed(list(GOLDEN_INPUTS["dataset"].items())))
    assert fingerprint(shuffled) == fingerprint(GOLDEN_INPUTS)


def _leaves(d, path=()):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _leaves(v, (*path, k))
        else:
            yield (*path, k), v


@pytest.mark.parametrize("path", [p for p, _ in _leaves(GOLDEN_INPUTS)])
def test_every_value_change_changes_it(path):
    import copy

    changed = copy.deepcopy(GOLDEN_INPUTS)
    node = changed
    for k in path[:-1]:
        node = node[k]
    old = node[path[-1]]
    node[path[-1]] = "x" if old is None else (old + ["Z"] if isinstance(old, list) else str(old) + "'")
    assert fingerprint(changed) != fingerprint(GOLDEN_INPUTS)
    node[path[-1]] = old
    assert fingerprint(changed) == fingerprint(GOLDEN_INPUTS)


def test_types_and_defaults_are_not_dropped():
    base = fingerprint({"a": 1})
    assert fingerprint({"a": 1.0}) != base
    assert fingerprint({"a": "1"}) != base
    assert fingerprint({"a": True}) != base
    assert fingerprint({"a": 1, "b": None}) != base  # a None-valued (defaulted) key is still hashed
    assert fingerprint({"a": np.int64(1)}) == base
    assert fingerprint({"a": [1, 2]}) == fingerprint({"a": (1, 2)}) == fingerprint({"a": np.array([1, 2])})


def test_rejects_unhashable_inputs():
    with pytest.raises(TypeError, match="x.y"):
        fingerprint({"x": {"y": {1, 2}}})
    with pytest.raises(TypeError, match="non-string key"):
        fingerprint({"x": {1: 2}})
    with pytest.raises(ValueError, match="nan"):
        fingerprint({"x": float("nan")})


def test_spec_fingerprint_includes_schema_version_and_names(monkeypatch):
    spec = FeatureSetSpec("aloe", "pubmedqa", "none", {"questions_fp": "abc", "x": 1})
    assert (
        spec.fingerprint
        == FeatureSetSpec("aloe", "pubmedqa", "none", {"x": 1, "questions_fp": "abc"}).fingerprint
    )
    assert spec.fingerprint != FeatureSetSpec("aloe", "pubmedqa", "relevant", spec.inputs).fingerprint
    assert spec.fingerprint != FeatureSetSpec("gemma2", "pubmedqa", "none", spec.inputs).fingerprint
    import walla.store.features._spec as fsmod

    before = spec.fingerprint
    monkeypatch.setattr(fsmod, "FEATURE_SCHEMA_VERSION", 99)
    assert spec.fingerprint != before
    assert spec.path(Path("/s")).as_posix().startswith("/s/features/aloe/pubmedqa/none/")


def test_spec_requires_questions_fp_and_valid_names():
    with pytest.raises(ValueError, match="questions_fp"):
        FeatureSetSpec("aloe", "pubmedqa", "none", {})
    with pytest.raises(ValueError, match="variant"):
        FeatureSetSpec("aloe", "pubmedqa", "wrong", {"questions_fp": "a"})
    with pytest.raises(ValueError, match="directory name"):
        FeatureSetSpec("../aloe", "pubmedqa", "none", {"questions_fp": "a"})
