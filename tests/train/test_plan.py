"""Train plans (train/plan.py): every shipped scenario resolves, precedence, all problems at once."""

from __future__ import annotations

import textwrap

import pytest
import yaml
from walla.manifests.scenario import list_scenarios
from walla.manifests.validate import ConfigError
from walla.train.methods import REGISTRY
from walla.train.plan import Overrides, load_plan, plan_yaml


@pytest.mark.parametrize("name", list_scenarios())
def test_every_scenario_resolves_to_a_complete_plan(name):
    plan = load_plan(name)
    names = [m.name for m in plan.methods]
    paper = [n for n in REGISTRY if not n.endswith("-ctx")]
    assert names == (list(REGISTRY) if name.startswith("demo-") else paper) and plan.seeds == (
        18,
        19,
        20,
        21,
        22,
    )
    shown = yaml.safe_load(plan_yaml(plan))
    assert shown["scenario"] == name and list(shown["methods"]) == names
    walla = {m.name: m for m in plan.methods if m.info.family == "walla"}
    assert walla["walla-ii"].config.variant == "II" and walla["walla-i-log"].config.pooling == "log"
    assert (
        walla["walla-i-log"].display == "WALLA I (log pool)"
        and walla["walla-i-cal"].display == "WALLA I (calibrated)"
    )


def test_precedence_family_registry_method_override():
    plan = load_plan("hetero2-mmlu", Overrides(hparams={"walla-i": {"pooling": "log"}}))
    assert plan.method("walla-i").config.lr == 5.0e-7 and plan.method("walla-i").config.pooling == "log"
    assert (
        plan.method("walla-i").display == "WALLA I (log pool)"
        and plan.method("walla-ii").config.pooling == "linear"
    )
    plan = load_plan("homo-pubmedqa-aloe-x4", Overrides(hparams={"walla-ii": {"epochs": 2}}))
    assert plan.method("walla-i").config.epochs == 50 and plan.method("walla-ii").config.epochs == 2
    assert plan.method("walla-ii").config.lr == 1.0e-5 and plan.method("walla-i").config.lr == 5.0e-5
    plan = load_plan("demo-hetero-facts", Overrides(methods=("uniform",), seeds=(3,)))
    assert [m.name for m in plan.methods] == ["uniform"] and plan.seeds == (3,)


def test_every_problem_of_a_file_reported_together(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text(
        textwrap.dedent(
            """\
            # For: walla train --scenario bad.yaml
            include: _base.yaml
            description: bad
            scenario: {dataset: facts, agents: [smollm2-135m, gemma3-270m]}
            train:
              methods: [walla-i, wala-ii]
              seeds: [18, 18]
              hparams:
                wallaa: {lr: 1.0e-3}
                walla: {lr: fast, epochs: 0, colour: red}
            """
        )
    )
    with pytest.raises(ConfigError) as err:
        load_plan(p)
    text = "\n".join(err.value.problems)
    for part in [
        "train: seeds must be distinct ints, got (18, 18)",
    ]:
        assert part in text, text
    p.write_text(p.read_text().replace("seeds: [18, 18]", "seeds: [18]"))
    with pytest.raises(ConfigError) as err:
        load_plan(p)
    text = "\n".join(err.value.problems)
    for part in [
        "methods[1]: unknown method 'wala-ii' (did you mean 'walla-ii'?)",
        "hparams: unknown method or family 'wallaa'",
        "train.hparams.walla-i.lr: Input should be a valid number",
        "train.hparams.walla-i.colour: unknown key",
    ]:
        assert part in text, text
    assert all(str(p) in line for line in err.value.problems)


def test_a_key_is_a_float_even_without_a_dot():
    """PyYAML reads 5e-7 as a string; the plan still gets the float (pydantic lax mode), 'fast' fails."""
    plan = load_plan("demo-hetero-facts", Overrides(hparams={"walla": {"lr": "5e-7"}}))
    assert plan.method("walla-i").config.lr == 5e-7
