"""The paper's three scenario kinds, resolved from what the store holds (no manifest to write).

    walla train --scenario hetero [--dataset D] [--models a,b]            # every model extracted for D
    walla train --scenario homo --model M --agents N [--dataset D]        # N copies; one sees the context
    walla train --scenario hetero-context [--irrelevant] [--dataset D]    # all models; one sees the context

The spec is built from the store's complete feature sets; the training plan comes from the same YAML
presets the named scenarios include, read by walla.manifests.scenario.preset_scenario (_base.yaml plus
the family file: _hetero.yaml, _homo_pubmedqa.yaml or _bayesx.yaml; _demo.yaml instead when every agent
is an embedded offline model, whose few thousand generated rows the paper's learning rates would barely
move). `--preset demo|paper` overrides that choice, and walla train prints the preset it used and why.
Ambiguity (several datasets, a missing prompt variant) is one line listing the choices and the
`walla extract` command that resolves it.
"""

from __future__ import annotations

from pathlib import Path

from walla.manifests.catalog import collect_tables, resolve_model_name
from walla.manifests.names import KINDS, kind_built  # noqa: F401  (KINDS: the kinds of this module, named once there)
from walla.manifests.scenario import Scenario, ScenarioSpec, preset_scenario
from walla.manifests.validate import ConfigError, UsageError, build
from walla.store.listing import list_feature_sets
from walla.train.plan import Overrides, TrainPlan, plan_builder


def _inventory(store: Path) -> dict[str, dict[str, set[str]]]:
    """dataset -> model -> variants with a complete feature set."""
    out: dict[str, dict[str, set[str]]] = {}
    for info in list_feature_sets(store):
        if info.status == "complete":
            out.setdefault(info.dataset, {}).setdefault(info.model, set()).add(info.variant)
    return out


def _extract_cmd(model: str, dataset: str, variants: str) -> str:
    return f"walla extract --model {model} --dataset {dataset} --variants {variants}"


def _dataset(inv: dict, dataset: str | None, store: Path, kind: str) -> str:
    if dataset is not None:
        if dataset not in inv:
            have = ", ".join(sorted(inv)) or "none"
            raise ValueError(
                f"store {store} holds no complete feature set of dataset {dataset!r} (it has: {have}); "
                f"run {_extract_cmd('<model>', dataset, 'none' if kind == 'hetero' else 'none,relevant')}"
            )
        return dataset
    if len(inv) == 1:
        return next(iter(inv))
    if not inv:
        raise ValueError(
            f"store {store} holds no complete feature set; run e.g. walla extract --model smollm2-135m "
            f"--dataset facts --store {store}"
        )
    raise ValueError(
        f"store {store} holds several datasets ({', '.join(sorted(inv))}); choose one with --dataset"
    )


PRESETS = ("demo", "paper")  # --preset: the embedded demo's settings, or the paper's for the kind


def _presets(
    kind: str, dataset: str, agents: tuple[str, ...], models_table: dict, choice: str | None = None
) -> tuple[list[str], str]:
    """(preset files, the line saying which preset and why): the demo's when every agent is an embedded
    package model, else the paper's family file for the kind and dataset; `choice` (--preset) overrides."""
    if choice is not None and choice not in PRESETS:
        raise UsageError(f"--preset {choice!r}: expected one of {', '.join(PRESETS)}")
    table = {a: models_table.get(a) for a in dict.fromkeys(agents)}
    outside = [a for a, info in table.items() if info is None or info.source != "package"]
    if dataset == "bayesx":
        family, paper = "_bayesx.yaml", "paper bayesx"
    elif kind == "homo":
        family, paper = "_homo_pubmedqa.yaml", "paper homo"
    else:
        family, paper = "_hetero.yaml", "paper hetero"
    if choice == "demo" or (choice is None and not outside):
        family, name = "_demo.yaml", "demo"
    else:
        name = paper
    if choice is not None:
        why = f"--preset {choice}"
    elif not outside:
        why = "every agent is an embedded model; --preset paper for the paper's settings"
    else:
        what = "is not an embedded model" if len(outside) == 1 else "are not embedded models"
        why = f"{', '.join(outside)} {what}; --preset demo for the demo's settings"
    return ["_base.yaml", family], f"preset: {name} ({why}): manifests/scenarios/_base.yaml + {family}"


def kind_spec(
    kind: str,
    store: Path,
    models_table: dict,
    datasets: dict,
    *,
    dataset=None,
    models=None,
    model=None,
    agents=None,
    irrelevant=False,
    eval_dataset=None,
):
    """The ScenarioSpec of a scenario kind over the store's feature sets."""
    inv = _inventory(store)
    if dataset is None and eval_dataset is not None:
        ds = _dataset({d: v for d, v in inv.items() if d != eval_dataset}, None, store, kind)
    else:
        ds = _dataset(inv, dataset, store, kind)
    if eval_dataset is None and ds in datasets and datasets[ds].split_protocol.get("mode") == "none":
        raise ValueError(
            f"dataset {ds!r} has no training rows (every row is test, as the paper's ARC-Challenge); name the "
            f"dataset to train on and test on {ds}: walla train --scenario {kind} --dataset mmlu --eval-dataset {ds}"
        )
    if eval_dataset is not None and eval_dataset not in inv:
        raise ValueError(
            f"store {store} holds no complete feature set of --eval-dataset {eval_dataset!r}; run "
            f"{_extract_cmd('<model>', eval_dataset, 'none')}"
        )
    if model is not None and model not in inv[ds]:  # the name or path the user gave the extract stage
        model = resolve_model_name(model, models_table)[0]
    if models:
        models = [m if m in inv[ds] else resolve_model_name(m, models_table)[0] for m in models]
    have = inv[ds]
    variants = (
        {"none"} if kind == "hetero" else {"none", "relevant"} | ({"irrelevant"} if irrelevant else set())
    )
    if kind == "homo":
        if model is None or agents is None or agents < 2:
            raise UsageError("--scenario homo needs --model M and --agents N (N >= 2)")
        chosen = (model,) * agents
        name = f"homo-{ds}-{model}-x{agents}"
    else:
        if model is not None or agents is not None:
            raise UsageError(f"--model/--agents are for --scenario homo; {kind} takes --models a,b,...")
        # default: every model extracted for the dataset (and, for OOD, for the eval dataset too)
        chosen = (
            tuple(models) if models else tuple(m for m in sorted(have) if m in inv.get(eval_dataset, have))
        )
        name = (
            f"{kind}-{ds}"
            + (f"-{eval_dataset}" if eval_dataset else "")
            + ("-irrelevant" if irrelevant else "")
        )
    for m in dict.fromkeys(chosen):
        for d in [ds] + ([eval_dataset] if eval_dataset else []):
            missing = sorted(variants - inv[d].get(m, set()))
            if missing:
                raise ValueError(
                    f"scenario {name}: model {m!r} has no complete feature set of {d} for variant(s) "
                    f"{', '.join(missing)}; run {_extract_cmd(m, d, ','.join(sorted(variants)))}"
                )
    if len(chosen) < 2:
        raise ValueError(
            f"scenario {name}: needs >= 2 agents, the store has {list(chosen)} for {ds}; extract another "
            f"model: {_extract_cmd('<model>', ds, ','.join(sorted(variants)))}"
        )
    rule = "none" if kind == "hetero" else ("one_relevant_one_irrelevant" if irrelevant else "one_relevant")
    what = {"hetero": "all extracted models, no context", "homo": f"{agents} x {model}, one sees the context"}
    spec = build(
        ScenarioSpec,
        {
            "name": name,
            "dataset": ds,
            "agents": chosen,
            "context_rule": rule,
            "eval_dataset": eval_dataset,
            "description": f"{kind} on {ds} from the store ({what.get(kind, 'all models, one sees the context')})",
            "source": f"--scenario {kind} (store {store})",
        },
        f"--scenario {kind}",
    )
    return spec


def plan_for_kind(
    kind: str, store: Path, overrides: Overrides, preset: str | None = None, **kw
) -> tuple[TrainPlan, str]:
    """(the full TrainPlan of a scenario kind, the preset line): spec from the store, train section from
    the presets (`preset`: demo | paper, None to choose by the agents)."""
    problems: list[str] = []
    models_table, datasets = collect_tables(None, problems)  # read once: the spec and the presets use them
    if problems:
        raise ConfigError(problems)
    scenario = Scenario(kind_spec(kind, store, models_table, datasets, **kw), models_table, datasets)
    files, line = _presets(kind, scenario.spec.dataset, scenario.spec.agents, models_table, preset)
    plan = preset_scenario(scenario, files, plan_builder(overrides))
    assert plan is not None  # None only alongside problems, which preset_scenario raises
    return plan, line


def trained_kind(name: str, runs: Path) -> tuple[str, dict] | None:
    """(kind, its options) that rebuild scenario `name`, the name a kind printed and wrote under `runs`
    (`hetero-medmcqa`), from the spec it recorded: so that name is accepted back (`--add-agent`, a rerun).
    None: `name` is not a kind-built scenario trained under `runs`."""
    spec = kind_built(name, runs)
    if spec is None:
        return None
    kind = str(spec["source"]).removeprefix("--scenario ").split(" ")[0]
    agents = list(spec["agents"])
    options = dict(
        dataset=spec["dataset"],
        eval_dataset=spec.get("eval_dataset"),
        irrelevant=spec.get("context_rule") == "one_relevant_one_irrelevant",
    )
    if kind == "homo":
        options.update(model=agents[0], agents=len(agents))
    else:
        options.update(models=agents)
    return kind, options
