"""Registries are the only lists: a new dataset loader and a new method are one registry entry each.

The loader below is registered in a temporary copy of extract's loader registry and the method in a
temporary copy of the method registry (monkeypatch); no other file of the project is edited. The dataset
extracts through the dummy backend with its loader's prompt template; the method appears in a plan that
says `methods: all` (and in the default list), trains and writes its runs.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
from synthetic import make_private_context_scenario
from walla.evaluate.compute import is_router
from walla.extract import run as extract_run
from walla.extract.config import ExtractConfig
from walla.extract.datasets import load_dataset_table, registry
from walla.extract.datasets.registry import Loader, default_template, get_loader
from walla.extract.datasets.rows import DatasetRequest, Loaded, canonical_row
from walla.manifests import catalog
from walla.manifests.scenario import Scenario, ScenarioSpec
from walla.manifests.validate import check, config
from walla.store.features import read_feature_set
from walla.train import methods
from walla.train.engine import TrainEnv
from walla.train.methods import MethodInfo, MethodOutput
from walla.train.plan import Overrides, build_plan, load_plan
from walla.train.run import run_plan
from walla.train.runs import list_run_dirs

# --- a new dataset loader: one function ---------------------------------------------------------------


def load_parity(req: DatasetRequest) -> Loaded:
    """Generated yes/no questions: is i even?"""
    n = int((req.generator or {}).get("n", 40))
    rows = [canonical_row(f"parity-{i}", f"Is {i} even?", ["yes", "no"], i % 2) for i in range(n)]
    return Loaded(rows, [f"parity row {i}" for i in range(n)], {"generator": "parity", "n": n})


@pytest.fixture
def parity_loader(monkeypatch):
    monkeypatch.setitem(registry.LOADERS, "parity", Loader("parity", load_parity, "mc"))


def test_a_new_loader_is_one_registry_entry(parity_loader, tmp_path, monkeypatch):
    (tmp_path / "datasets.yaml").write_text(
        textwrap.dedent(
            """\
            # For: walla extract --dataset parity
            parity: {loader: parity, generator: {n: 40}, split_protocol: {mode: uniform, seed: 3}}
            """
        )
    )
    datasets = catalog.load_datasets(tmp_path)  # the catalog accepts any loader name
    assert datasets["parity"].loader == "parity" and default_template("parity") == "mc"
    shipped = catalog.load_datasets()
    monkeypatch.setattr(catalog, "load_datasets", lambda: {**shipped, **datasets})  # as if in datasets.yaml
    cfg = ExtractConfig(
        model="smollm2-135m", dataset="parity", backend="dummy", store=tmp_path / "store", progress=False
    )
    [path] = extract_run.run(cfg, out=lambda s: None)
    fs = read_feature_set(path)
    assert fs.rows.height == 40 and fs.rows["n_options"].to_list() == [2] * 40
    first = fs.rows.filter(fs.rows["question_id"] == "parity-3")["prompt"][0]
    assert "Question: Is 3 even?\nChoices:\nA) yes\nB) no\nAnswer:" in first  # the loader's "mc" template
    assert fs.meta["fingerprint_inputs"]["inputs"]["prompt"]["template"] == "mc"


def test_an_unknown_loader_is_one_line_with_close_matches(parity_loader):
    with pytest.raises(KeyError) as err:
        get_loader("parrity")
    msg = err.value.args[0]
    assert "unknown dataset loader 'parrity' (did you mean 'parity'?)" in msg and "\n" not in msg
    assert "known loaders: pubmedqa, medmcqa, mmlu, arc, jsonl, bayesx, facts, parity" in msg


def test_a_generated_loader_needs_its_generator_block():
    """The registry knows which loaders generate their rows; the catalog does not need to."""
    assert [n for n, x in registry.LOADERS.items() if x.generated] == ["bayesx", "facts"]
    with pytest.raises(
        ValueError, match="loader 'facts' generates its rows; .* needs a `generator: {n, seed}`"
    ):
        load_dataset_table(DatasetRequest(name="my-facts", loader="facts"))


# --- a new method: one module (here, this one) ---------------------------------------------------------


@config
class Config:
    temperature: float = 0.5  # softmax temperature over the agents' top-option probabilities

    def __post_init__(self) -> None:
        check(self.temperature > 0, "temperature", "> 0", self.temperature)


def fit(data, cfg: Config, seeds, env, logs) -> list[dict]:
    return [{"temperature": cfg.temperature, "seed": s} for s in seeds]


def predict(state: dict, data, rows: np.ndarray, env) -> MethodOutput:
    """Weights: softmax over agents of each agent's top-option probability (confidence pooling)."""
    probs = data.probs[rows]  # [n, M, K]
    conf = probs.max(-1) / state["temperature"]  # [n, M]
    w = np.exp(conf - conf.max(1, keepdims=True))
    w = (w / w.sum(1, keepdims=True)).astype(np.float32)  # [n, M]
    agg = np.einsum("nm,nmk->nk", w, probs).astype(np.float32)  # [n, K]
    return MethodOutput(weights=w, agg_probs=agg)


@pytest.fixture
def confidence_method(monkeypatch):
    info = MethodInfo("confidence", __name__, "Confidence", "learning_free")  # this module is the method
    monkeypatch.setitem(methods.REGISTRY, "confidence", info)
    return info


def test_a_new_method_is_one_registry_entry(confidence_method, tmp_path):
    scenario = tmp_path / "mine.yaml"
    scenario.write_text(
        textwrap.dedent(
            """\
            # For: walla train --scenario mine.yaml
            include: [_base.yaml]
            description: every method
            scenario: {dataset: facts, agents: [smollm2-135m, gemma3-270m], context_rule: one_relevant}
            train: {methods: all, hparams: {confidence: {temperature: 0.25}}}
            """
        )
    )
    plan = load_plan(scenario)
    assert [m.name for m in plan.methods] == list(methods.REGISTRY)
    assert plan.method("confidence").config.temperature == 0.25 and not is_router("confidence")
    scenario.write_text(scenario.read_text().replace("methods: all, ", ""))
    names = [m.name for m in load_plan(scenario).methods]  # no list: the registry's default methods
    assert names[-1] == "confidence" and "route-llm" in names and "route-llm-ctx" not in names

    data = make_private_context_scenario(n=120, m=3, k=2, h=6, seed=4)
    spec = ScenarioSpec(name=data.name, dataset="synthetic", agents=tuple(data.agents))
    problems: list[str] = []
    small = build_plan(
        {"train": {"methods": ["confidence", "uniform"], "seeds": [18, 19]}},
        tmp_path / "synthetic.yaml",
        Scenario(spec, {}, {}),
        Overrides(),
        problems,
    )
    assert not problems, problems
    results = run_plan(small, data, tmp_path / "runs", TrainEnv(), note=lambda s: None)
    assert [(r["method"], r["seed"]) for r in results] == [
        ("confidence", 18),
        ("confidence", 19),
        ("uniform", 18),
        ("uniform", 19),
    ]
    assert {d.method for d in list_run_dirs(tmp_path / "runs", data.name)} == {"confidence", "uniform"}
