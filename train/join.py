"""Agents joining and leaving a trained WALLA market, without retraining everyone.

    walla-train --scenario demo-homo-facts --add-agent gemma3-270m     # runs of "<scenario>+gemma3-270m"
    walla-train --scenario demo-homo-facts --drop-agent smollm2-135m   # runs of "<scenario>-smollm2-135m"

The joined scenario is the base scenario's spec with the agent slot added (or the last slot of that model
removed). Every WALLA run of it continues, per seed, from the base run's trained heads (state.pt): each
remaining agent keeps its own head, the newcomer's head starts from its seeded default init, and all of
them keep learning online over ONE pass of the training stream (`--join-epochs`, default 1) from their
own payouts -- still decentralized, since no head ever sees another agent's features. Methods without per-agent heads (the baselines) are trained
on the joined scenario as usual. `--from-scratch` trains the joined scenario's WALLA heads from their
default init instead (the comparison the README reports).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from walla.manifests.validate import replace, to_dict
from walla.train.engine import load_checkpoint
from walla.train.methods import method_module
from walla.train.plan import MethodPlan, TrainPlan, with_spec
from walla.train.runs import STATE, is_complete, list_run_dirs, read_run_meta
from walla.train.wager_training import init_heads


def joined_plan(
    base: TrainPlan, add: list[str], drop: list[str], epochs: int | None = None
) -> tuple[TrainPlan, list[int]]:
    """(plan of the joined scenario, base slot index of each joined slot; -1 for a newcomer).

    `epochs`: passes over the training stream for the continued WALLA heads (None: the plan's own)."""
    agents = list(base.spec.agents)
    origin = list(range(len(agents)))
    for d in drop:
        if d not in agents:
            raise ValueError(f"--drop-agent {d!r}: not an agent of {base.spec.name} ({', '.join(agents)})")
        i = len(agents) - 1 - agents[::-1].index(d)  # the last slot of that model
        del agents[i], origin[i]
    agents += add
    origin += [-1] * len(add)
    if len(agents) < 2:
        raise ValueError(f"the joined scenario would have {len(agents)} agent(s); WALLA needs >= 2")
    name = base.spec.name + "".join(f"+{a}" for a in add) + "".join(f"-{d}" for d in drop)
    what = ", ".join([*(f"{a} joins" for a in add), *(f"{d} leaves" for d in drop)])
    spec = dataclasses.replace(
        base.spec, name=name, agents=tuple(agents), description=f"{base.spec.description} ({what})"
    )
    plan = with_spec(base, spec)
    if epochs is not None:
        methods = tuple(
            dataclasses.replace(m, config=replace(m.config, epochs=epochs)) if m.info.family == "walla" else m
            for m in plan.methods
        )
        plan = dataclasses.replace(plan, methods=methods)
    return plan, origin


def _fit_rows(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """An old head's parameter slice in the new module's shape: input rows zero-padded or cropped (the
    extra input columns are zero-padding, so the function is unchanged)."""
    out = torch.zeros_like(new)
    idx = tuple(slice(0, min(a, b)) for a, b in zip(old.shape, new.shape, strict=True))
    out[idx] = old[idx]
    return out


def _without_epochs(config: dict) -> dict:
    return {k: v for k, v in config.items() if k != "epochs"}


def base_state(runs: Path, base_name: str, mp: MethodPlan, seed: int, data) -> Path:
    """The state.pt of the base scenario's run to continue: its only trained configuration of this method
    and seed, or, when it has several (run keys), the one whose config is the joined plan's (epochs
    aside: joining sets its own).

    Raises:
        FileNotFoundError: no such run (train the base scenario first). ValueError: several match.
    """
    found = [
        d.path
        for d in list_run_dirs(runs, base_name)
        if d.method == mp.name and d.seed == seed and d.key_id is not None
        if is_complete(d.path) and (d.path / STATE).exists()
    ]
    if len(found) > 1:
        module = method_module(mp.name)
        cfg = module.resolve(mp.config, data) if hasattr(module, "resolve") else mp.config
        want = _without_epochs(to_dict(cfg))
        found = [p for p in found if _without_epochs(read_run_meta(p).get("config") or {}) == want]
    if not found:
        raise FileNotFoundError(
            f"{runs / base_name / mp.name}: no trained heads (state.pt) of seed {seed} to continue; train "
            f"the base scenario with its states first: walla-train --scenario {base_name} --methods "
            f"{mp.name} --seed-list {seed} --save-states {mp.name}"
        )
    if len(found) > 1:
        raise ValueError(
            f"{base_name}: {len(found)} trained runs of {mp.name} seed {seed} with this config "
            f"({', '.join(str(p) for p in found)}); they differ in precision, device or calibration: move "
            "the ones not to continue out of the runs directory, or train the joined scenario --from-scratch"
        )
    return found[0] / STATE


def initial_params(plan: TrainPlan, base_name: str, origin: list[int], data, runs: Path) -> dict:
    """method -> seed -> stacked head parameters for the joined scenario, continued from the base runs.

    Raises:
        FileNotFoundError: a base WALLA run has no state.pt (train the base scenario first).
        ValueError: several base runs could be meant (base_state).
    """
    in_dims = [int(h.shape[1]) for h in data.hidden]
    out: dict[str, dict[int, list[torch.Tensor]]] = {}
    for mp in plan.methods:
        if mp.info.family != "walla":
            continue
        for seed in plan.seeds:
            old = load_checkpoint(base_state(runs, base_name, mp, seed, data))
            n_kinds, m_old = old["n_kinds"], len(old["in_dims"])
            fresh = list(init_heads([seed], in_dims, mp.config, n_kinds).parameters())
            params = [p.detach().clone() for p in fresh]  # [n_kinds * M_new, ...] each
            m_new = len(in_dims)
            for k in range(n_kinds):
                for i_new, i_old in enumerate(origin):
                    if i_old < 0:
                        continue
                    for p_new, p_old in zip(params, old["params"], strict=True):
                        p_new[k * m_new + i_new] = _fit_rows(
                            p_old[k * m_old + i_old], p_new[k * m_new + i_new]
                        )
            out.setdefault(mp.name, {})[seed] = params
    return out
