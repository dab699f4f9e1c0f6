"""Agents joining and leaving a trained WALLA market, without retraining everyone.

    walla train --scenario demo-homo-facts --add-agent gemma3-270m     # runs of "<scenario>+gemma3-270m"
    walla train --scenario demo-homo-facts --drop-agent smollm2-135m   # runs of "<scenario>-smollm2-135m"

The joined scenario is the base scenario's spec with the agent slot added (or the last slot of that model
removed). Every WALLA run of it continues, per seed, from the base run's trained heads (state.pt): each
remaining agent keeps its own head, the newcomer's head starts from its seeded default init, and all of
them keep learning online over ONE pass of the training stream (`--join-epochs`, default 1) from their
own payouts -- still decentralized, since no head ever sees another agent's features. Methods without per-agent heads (the baselines) are trained
on the joined scenario as usual. `--from-scratch` trains the joined scenario's WALLA heads from their
default init instead (the comparison the README reports).

Which base run a joined run continues is computed, not searched (the base-key rule, also the market's:
market/head.py takes only current runs): the run key the base scenario's plan gives the method under this
command's settings (train/runs/_keys.py plan_key, on the base scenario as assembled now), one key for every seed.
A seed whose base run is missing or of another key (another lr, precision, device or calibration), or whose
base run is stale (other inputs, another TRAIN_SCHEMA), stops the join with one line naming the keys and
what differs. The joined runs' key names that base key (`init: {continued_from, base_key_id}`) and the
base scenario's inputs id (`base_inputs_id`), and each seed's run.json the base run it continued
(`continued`): a joined run counts only while that base run is still the current run of its key
(train/runs/_lineage.py lineage_reason, checked wherever a run is read), so a join of a base since retrained from
other inputs is stale, never averaged with a join of the new base. Every refusal names the `walla train`
command that fixes it, with the options that built the base scenario (train_command: a kind's too).
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import torch
from walla.manifests.validate import UsageError, replace
from walla.store.scenario import ScenarioData
from walla.train.config import TrainConfig
from walla.train.engine import TrainEnv, load_checkpoint
from walla.train.plan import TrainPlan, with_spec
from walla.train.runs import (
    STATE,
    VALIDITY,
    Continued,
    RunFormatError,
    is_complete,
    jsonable,
    key_dir,
    key_id,
    list_run_dirs,
    plan_key,
    read_key_file,
    read_run_meta,
    run_dir,
    stale_run_reason,
)
from walla.train.wagers import init_heads


def train_command(cfg: TrainConfig, *, base: bool = False, settings: bool = False) -> str:
    """The `walla train` command of `cfg`'s scenario: --scenario with a kind's options, the agents joining
    or leaving (`base`: without them, the base scenario's command), the rows and where the store and runs
    are; `settings`: also what picks the run key (--set, --device, --precision, --calibrated). Messages
    name it so that their fix works for a kind-built or joined scenario, whose name is no manifest."""
    default = TrainConfig(scenario=cfg.scenario)
    out = ["walla", "train", "--scenario", cfg.scenario]

    def opt(flag: str, value, skip=None) -> None:
        if value is not None and value != skip:
            out.extend([flag, str(value)])

    opt("--dataset", cfg.dataset)
    opt("--models", ",".join(cfg.models) if cfg.models else None)
    opt("--model", cfg.model)
    opt("--agents", cfg.agents)
    out += ["--irrelevant"] if cfg.irrelevant else []
    opt("--eval-dataset", cfg.eval_dataset)
    opt("--preset", cfg.preset)
    if not base:
        for a in cfg.add_agent:
            opt("--add-agent", a)
        for d in cfg.drop_agent:
            opt("--drop-agent", d)
        out += ["--from-scratch"] if cfg.from_scratch else []
        opt("--join-epochs", cfg.join_epochs, default.join_epochs)
    opt("--limit-rows", cfg.limit_rows)
    opt("--store", cfg.store, default.store)
    opt("--runs", cfg.runs, default.runs)
    if settings:
        for item in cfg.sets:
            opt("--set", item)
        opt("--device", cfg.device, default.device)
        opt("--precision", cfg.precision, default.precision)
        if cfg.calibrated is not None:
            out.append("--calibrated" if cfg.calibrated else "--uncalibrated")
    return shlex.join(out)


def joined_plan(
    base: TrainPlan, add: list[str], drop: list[str], epochs: int | None = None
) -> tuple[TrainPlan, list[int]]:
    """(plan of the joined scenario, base slot index of each joined slot; -1 for a newcomer).

    `epochs`: passes over the training stream for the continued WALLA heads (None: the plan's own)."""
    agents = list(base.spec.agents)
    origin = list(range(len(agents)))
    for d in drop:
        if d not in agents:
            raise UsageError(f"--drop-agent {d!r}: not an agent of {base.spec.name} ({', '.join(agents)})")
        i = len(agents) - 1 - agents[::-1].index(d)  # the last slot of that model
        del agents[i], origin[i]
    agents += add
    origin += [-1] * len(add)
    if len(agents) < 2:
        raise UsageError(f"the joined scenario would have {len(agents)} agent(s); WALLA needs >= 2")
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


def _differences(want: dict, have: dict) -> str:
    """'config.lr 0.05 (not 0.0005), precision bf16-mixed (not 32-true)': where run key `have` differs from
    `want` (both flattened to dotted paths)."""

    def flat(d: dict, prefix: str = "") -> dict:
        out = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
        return out

    a, b = flat(want), flat(have)
    return ", ".join(f"{k} {b.get(k)!r} (not {a.get(k)!r})" for k in sorted({*a, *b}) if a.get(k) != b.get(k))


def base_run(runs: Path, base: str, key: dict, seed: int, command: str | None = None) -> tuple[Path, dict]:
    """(run directory, run.json) of the base scenario's run of run key `key` and `seed`: the run a joined
    run continues. The key is the one the base plan gives under this command's settings (run_keys.plan_key),
    so a base run of another config, precision, device or calibration is never taken instead. `command`:
    the base scenario's `walla train` command with this command's settings (train_command(cfg, base=True,
    settings=True)); None: the one of a base scenario manifest named `base`.

    Raises:
        FileNotFoundError: no complete run of that key and seed (names the keys the seed has instead and
            what differs, and the command that trains it).
        ValueError: the run is stale (trained from other inputs or by another schema) or has no state.pt.
    """
    method, kid = key["method"], key_id(key)
    path = run_dir(runs, base, method, kid, seed)
    command = command or f"walla train --scenario {shlex.quote(base)}"
    retrain = f"{command} --methods {method} --seed-list {seed} --save-states {method}"
    if not is_complete(path):
        have = _other_keys(runs, base, key, seed) or f"no trained {method} run of seed {seed}"
        raise FileNotFoundError(
            f"{runs / base / method}: no base run of key {kid} (this command's settings) and seed {seed} to "
            f"continue ({have}); train the base scenario with its states first: {retrain}"
        )
    meta = read_run_meta(path)
    have = meta.get("run_key") if isinstance(meta.get("run_key"), dict) else None
    why = stale_run_reason(path, meta, key["scenario_inputs_id"])  # a base that is a join: its lineage too
    if why is None and have != jsonable(key):
        why = f"its run key differs from its directory's: {_differences(key, have)}"
    if why is not None:
        raise ValueError(f"{path}: stale base run ({why}); not continued: retrain it: {retrain}")
    if not (path / STATE).exists():
        raise ValueError(f"{path}: no trained heads ({STATE}) to continue; write them: {retrain}")
    return path, meta


def _other_keys(runs: Path, base: str, key: dict, seed: int) -> str:
    """'seed 19 is trained only under key 0a1b2c3d4e (config.lr 0.05 (not 0.0005))': the other run keys of
    the base scenario holding a complete run of this method and seed, and what differs; '' if none."""
    method, kid = key["method"], key_id(key)
    others = sorted(
        {
            d.key_id
            for d in list_run_dirs(runs, base)
            if d.method == method and d.seed == seed and d.key_id not in (None, kid) and is_complete(d.path)
        }
    )
    want = {k: v for k, v in jsonable(key).items() if k not in VALIDITY}
    parts = []
    for other in others:
        try:
            have = read_key_file(key_dir(runs, base, method, other)).get("run_key") or {}
        except RunFormatError:
            have = {}
        diff = _differences(want, {k: v for k, v in have.items() if k not in VALIDITY}) if have else ""
        parts.append(f"key {other}" + (f": {diff}" if diff else ""))
    return f"seed {seed} is trained only under {'; '.join(parts)}" if parts else ""


def initial_params(
    base_plan: TrainPlan,
    plan: TrainPlan,
    origin: list[int],
    base_data: ScenarioData,
    data: ScenarioData,
    runs: Path,
    env: TrainEnv,
    command: str | None = None,
) -> dict[str, Continued]:
    """method -> the base runs its joined runs continue from (run_keys.Continued), with each seed's stacked
    head parameters for the joined scenario.

    Every seed continues the base run of ONE run key: the key `base_plan` gives the method on `base_data`
    (the base scenario as assembled now) under `env` -- the runs `walla train --scenario <base>` with this
    command's settings trains. A seed whose base run is missing, of another key, or stale stops the join
    with one line naming the keys and the command that trains it (base_run; `command`: the base
    scenario's, train_command(cfg, base=True, settings=True)).

    Raises:
        FileNotFoundError: a base run is missing (named, with the keys the seed has instead).
        ValueError: a base run is stale or has no state.pt.
    """
    in_dims = [int(h.shape[1]) for h in data.hidden]
    out: dict[str, Continued] = {}
    for mp in plan.methods:
        if mp.info.family != "walla":
            continue
        _, key = plan_key(base_plan, base_plan.method(mp.name), base_data, env)
        ids, by_seed = {}, {}
        for seed in plan.seeds:
            path, meta = base_run(runs, base_plan.spec.name, key, seed, command)
            ids[seed] = str(meta.get("inputs_id"))
            old = load_checkpoint(path / STATE)
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
            by_seed[seed] = params
        out[mp.name] = Continued(base_plan.spec.name, key, ids, by_seed)
    return out
