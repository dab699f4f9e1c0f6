"""Model/dataset tables (manifests/catalog.py), scenario files and include rules (manifests/scenario.py,
yaml_io.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from walla.manifests.catalog import load_datasets, load_models, resolve_model_name
from walla.manifests.scenario import list_scenarios, read_scenario
from walla.manifests.validate import ConfigError
from walla.manifests.yaml_io import manifests_dir

PAPER = {
    "homo-pubmedqa-aloe-x4": (("aloe",) * 4, "pubmedqa", None, "one_relevant"),
    "homo-pubmedqa-aloe-x12": (("aloe",) * 12, "pubmedqa", None, "one_relevant"),
    "homo-bayesx-gemma2-x8": (("gemma2",) * 8, "bayesx", None, "one_relevant"),
    "hetero2-mmlu": (("llama3.1", "aloe"), "mmlu", None, "none"),
    "hetero2-arc": (("llama3.1", "aloe"), "mmlu", "arc-challenge", "none"),
    "hetero4-medmcqa": (("gemma2", "llama3.1", "aloe", "biomistral"), "medmcqa", None, "none"),
    "hetero4-pubmedqa-irrelevant": (
        ("gemma2", "llama3.1", "aloe", "biomistral"),
        "pubmedqa",
        None,
        "one_relevant_one_irrelevant",
    ),
    "demo-hetero-facts": (("smollm2-135m",) * 2 + ("gemma3-270m",) * 2, "facts", None, "one_relevant"),
}


def _write(dir_: Path, name: str, text: str) -> Path:
    p = dir_ / name
    p.write_text(textwrap.dedent(text))
    return p


@pytest.mark.parametrize("name", sorted(PAPER))
def test_paper_and_demo_specs(name):
    s = read_scenario(name).spec
    assert (s.agents, s.dataset, s.eval_dataset, s.context_rule) == PAPER[name]
    assert s.description and s.context_seed == 42


def test_every_manifest_file_starts_with_its_command():
    assert set(PAPER) <= set(list_scenarios())
    for path in sorted(manifests_dir().rglob("*.yaml")):
        assert path.read_text().splitlines()[0].startswith("#"), path


def test_models_and_datasets_tables():
    models = load_models()
    assert {m: models[m].hidden_size for m in ("gemma2", "llama3.1", "aloe", "biomistral")} == {
        "gemma2": 3584,
        "llama3.1": 4096,
        "aloe": 4096,
        "biomistral": 4096,
    }
    assert models["smollm2-135m"].hidden_size == 576 and models["gemma3-270m"].gguf == "assemble()"
    ds = load_datasets()
    assert ds["pubmedqa"].hub == {"path": "qiaojin/PubMedQA", "name": "pqa_artificial", "split": "train"}
    assert ds["bayesx"].soft_target and ds["bayesx"].option_tokens == ["1", "0"]
    assert (
        ds["mmlu"].hub["split"] == "auxiliary_train" and ds["arc-challenge"].split_protocol["mode"] == "none"
    )


def test_bad_models_and_datasets_all_reported(tmp_path):
    _write(
        tmp_path,
        "models.yaml",
        """\
        # For: walla extract --model <name>
        m1: {source: hub, hidden_size: 8}
        m2: {source: package, package: p, hidden_size: 0, dtype: fp8, colour: red}
        """,
    )
    with pytest.raises(ConfigError) as err:
        load_models(tmp_path)
    msg = str(err.value)
    for part in [
        "m1: hub_id must be set for source 'hub'",
        "m2.dtype: Input should be",
        "m2.colour: unknown key",
    ]:
        assert part in msg, msg
    _write(
        tmp_path,
        "datasets.yaml",
        """\
        # For: walla extract --dataset <name>
        d1: {loader: pubmedqa, split_protocol: {mode: uniform}, option_tokens: [YES, NO]}
        d2: {loader: bayesx, split_protocol: {mode: fancy}, soft_target: true}
        """,
    )
    with pytest.raises(ConfigError) as err:
        load_datasets(tmp_path)
    msg = str(err.value)
    assert "d1.option_tokens[0]: True is a YAML boolean; quote it" in msg
    assert "d2: split_protocol.mode must be uniform | balanced_binary | none | given, got 'fancy'" in msg


def test_spec_problems_reported_together(tmp_path):
    p = _write(
        tmp_path,
        "bad.yaml",
        """\
        # For: walla train --scenario bad.yaml
        description: bad
        dataset: facts
        scenario:
          dataset: pubmedqaa
          agents: [aloe, llama3]
          context_rule: one_relevant
        """,
    )
    with pytest.raises(ConfigError) as err:
        read_scenario(p)
    problems = err.value.problems
    assert any("unknown top-level key 'dataset'" in x for x in problems)
    assert any(
        "scenario.dataset: unknown dataset 'pubmedqaa' (did you mean 'pubmedqa'?)" in x for x in problems
    )
    assert any("agents[1]: unknown model 'llama3' (did you mean 'llama3.1'?)" in x for x in problems)
    assert all(str(p) in x for x in problems)


def test_include_next_to_file_then_project_and_nowhere_else(tmp_path):
    """A user's scenario anywhere can include the project's fragments; never an arbitrary path."""
    p = _write(
        tmp_path,
        "mine.yaml",
        """\
        # For: walla train --scenario mine.yaml
        include: [_base.yaml, _local.yaml]
        description: mine
        scenario: {dataset: facts, agents: [smollm2-135m, gemma3-270m]}
        """,
    )
    _write(tmp_path, "_local.yaml", "# local fragment\nscenario: {context_rule: one_relevant}\n")
    s = read_scenario(p).spec
    assert s.context_rule == "one_relevant" and s.context_seed == 42 and s.name == "mine"
    for bad in ("/etc/passwd", "../mine.yaml", "sub/../../x.yaml"):
        p.write_text(p.read_text().replace("_local.yaml", bad))
        with pytest.raises(ConfigError, match="no absolute paths"):
            read_scenario(p)
        p.write_text(p.read_text().replace(bad, "_local.yaml"))
    with pytest.raises(ConfigError, match="did you mean 'demo-hetero-facts'"):
        read_scenario("demo-hetero-fact")


def test_ad_hoc_model_names_are_path_safe(tmp_path):
    models = load_models()
    assert resolve_model_name("aloe", models)[0] == "aloe"
    name, entry = resolve_model_name("hf:Org/My.Model@abc123", models)
    assert name == "hf-org--my.model-abc123" and entry.hub_id == "Org/My.Model" and entry.revision == "abc123"
    d = tmp_path / "..weird name"
    d.mkdir()
    name, entry = resolve_model_name(str(d), models)
    assert "/" not in name and not name.startswith(".") and entry.path == str(d.resolve())
    with pytest.raises(KeyError, match="unknown model 'alo'"):
        resolve_model_name("alo", models)


def _modules_loaded_by(package: str) -> list[str]:
    """Every walla module loaded after importing each module of `package`, in a fresh interpreter."""
    code = (
        "import importlib, pkgutil, sys\n"
        f"pkg = importlib.import_module({package!r})\n"
        f"for m in pkgutil.walk_packages(pkg.__path__, {package!r} + '.'):\n"
        "    importlib.import_module(m.name)\n"
        "print(' '.join(sorted(n for n in sys.modules if n.startswith('walla.'))))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()


def test_layers_point_one_way():
    """walla.manifests imports no stage; the store imports no manifest reader (it receives a Scenario); its
    command line (store/cli.py) uses the command layer's app and exit codes only (walla.cli, cli/exits.py), and
    its doors the command layer's lazy loader (cli/lazy.py `door`)."""
    loaded = _modules_loaded_by("walla.manifests")
    assert "walla.manifests.scenario" in loaded
    assert not [m for m in loaded if not m.startswith("walla.manifests")], loaded
    loaded = _modules_loaded_by("walla.store")
    assert "walla.store.scenario._assemble" in loaded
    command_layer = {"walla.cli", "walla.cli.exits", "walla.cli.lazy"}
    assert not [m for m in loaded if not m.startswith("walla.store") and m not in command_layer], loaded
