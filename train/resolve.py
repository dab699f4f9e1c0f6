"""What a `walla train` command asks for: its plan (resolve_plan) and the methods that keep a state.

    plan, preset_line, base_plan, origin = resolve_plan(cfg, store)  # a manifest, a kind, a join
    states = states_to_save(cfg.save_states, plan)                   # --save-states -> method names

Kept apart from the recipe (train/run.py): these read only the options, the manifests and the store's
listing, so every mistake in them is one usage line before any data is assembled or trained.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from walla.manifests.scenario import list_scenarios
from walla.manifests.validate import UsageError
from walla.train.config import TrainConfig
from walla.train.join import joined_plan
from walla.train.kinds import KINDS, plan_for_kind, trained_kind
from walla.train.plan import Overrides, TrainPlan, load_plan, with_spec

ALL_STATES = "all"  # --save-states all: every method of the plan


def resolve_plan(cfg: TrainConfig, store: Path) -> tuple[TrainPlan, str | None, TrainPlan, list[int] | None]:
    """The plan `cfg` asks for: (plan, the preset line of a kind, the base plan a join continues, join
    origin: each joined slot's slot in the base scenario, None when nothing joins)."""
    overrides = Overrides(
        methods=cfg.methods, seeds=cfg.seed_values(), calibrated=cfg.calibrated, hparams=cfg.hparams()
    )
    preset_line = None
    named = (
        cfg.scenario in KINDS
        or cfg.scenario in list_scenarios()
        or Path(cfg.scenario).suffix in (".yaml", ".yml")
    )
    trained = None if named else trained_kind(cfg.scenario, cfg.runs)
    if cfg.scenario in KINDS:
        kind_args = dict(
            dataset=cfg.dataset,
            models=cfg.models,
            model=cfg.model,
            agents=cfg.agents,
            irrelevant=cfg.irrelevant,
            eval_dataset=cfg.eval_dataset,
        )
        plan, preset_line = plan_for_kind(cfg.scenario, store, overrides, cfg.preset, **kind_args)
    elif trained is not None:  # a kind's scenario by the name it printed and wrote (`hetero-medmcqa`)
        plan, preset_line = plan_for_kind(trained[0], store, overrides, cfg.preset, **trained[1])
        if plan.spec.name != cfg.scenario:  # e.g. a joined scenario: its runs came from its base and a join
            raise UsageError(
                f"--scenario {cfg.scenario}: {trained[0]} over the options recorded in {cfg.runs / cfg.scenario} "
                f"builds {plan.spec.name} now; rerun the command that trained it (its base scenario, with "
                "--add-agent / --drop-agent)"
            )
    elif cfg.preset is not None:
        raise UsageError(
            f"--preset is for --scenario {' | '.join(KINDS)}; scenario {cfg.scenario!r} names its presets "
            "in its include: list"
        )
    else:
        plan = load_plan(cfg.scenario, overrides)
    base_plan, origin = plan, None
    if cfg.add_agent or cfg.drop_agent:
        epochs = None if cfg.from_scratch else cfg.join_epochs
        plan, origin = joined_plan(plan, list(cfg.add_agent), list(cfg.drop_agent), epochs)
        if cfg.from_scratch:
            plan = with_spec(plan, dataclasses.replace(plan.spec, name=f"{plan.spec.name}-scratch"))
    return plan, preset_line, base_plan, origin


def states_to_save(text: str | None, plan: TrainPlan) -> frozenset[str]:
    """--save-states: the methods of `plan` whose runs write state.pt (train/run.py says which use them).

    `text`: None (no state), "all", or comma-separated method names or families ("walla": every WALLA
    method of the plan). Raises UsageError naming a name that is neither.
    """
    if text is None:
        return frozenset()
    names = [t.strip() for t in str(text).split(",") if t.strip()]
    if not names:
        raise UsageError("--save-states: empty list (give methods or families, or all)")
    out: set[str] = set()
    for name in names:
        found = [m.name for m in plan.methods if name in (ALL_STATES, m.name, m.info.family)]
        if not found:
            known = sorted(
                {ALL_STATES, *(m.name for m in plan.methods), *(m.info.family for m in plan.methods)}
            )
            raise UsageError(
                f"--save-states {name!r}: not a method or family of this plan (one of {', '.join(known)})"
            )
        out.update(found)
    return frozenset(out)
