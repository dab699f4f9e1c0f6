"""The one place a run key is made: `plan_key` (run_plan, and train/join.py for the base runs a joined run
must continue), and `Continued`, what a joined method's runs continue from.

Kept apart from train/run.py so that join.py (which run.py's recipe calls) can use it without a cycle.
"""

from __future__ import annotations

import dataclasses

from walla.manifests.validate import to_dict
from walla.store.scenario import ScenarioData
from walla.train.engine import TrainEnv
from walla.train.methods import method_module
from walla.train.plan import MethodPlan, TrainPlan
from walla.train.runs._identity import data_inputs_id, key_id, run_key


@dataclasses.dataclass(frozen=True)
class Continued:
    """What one method's runs continue from (train/join.py): the base scenario's runs of ONE run key.

    The runs' key names the base key (`init`), so joined runs of different bases never share a row, and
    holds the base scenario's inputs id (`base_inputs_id`, a validity field); each seed's inputs id covers
    its base run's, so a joined run is redone when its base run changed, and counts only while its base run
    is current (lineage.lineage_reason)."""

    scenario: str  # the base scenario
    base_key: dict  # the base runs' run key (validity fields included)
    base_ids: dict[int, str]  # seed -> the base run's inputs_id (its run.json)
    params: dict[int, list]  # seed -> the stacked head parameters to start from

    @property
    def init(self) -> dict:
        return {"continued_from": self.scenario, "base_key_id": key_id(self.base_key)}

    def base_run(self, seed: int) -> dict:
        """run.json `continued` of a joined run of `seed`: the base run it continued, read back by
        lineage.lineage_reason."""
        return {
            "scenario": self.scenario,
            "key_id": key_id(self.base_key),
            "seed": int(seed),
            "inputs_id": self.base_ids[seed],
        }


def plan_key(
    plan: TrainPlan, mp: MethodPlan, data: ScenarioData, env: TrainEnv, continued: Continued | None = None
):
    """(resolved config, run key) of method `mp`'s runs of `plan` on `data`: the one place a run key is
    made (run_plan, and train/join.py for the base runs a joined run must continue). `continued`: the base
    runs a joined method's runs continue (its key's `init` and `base_inputs_id`; None: default init).

    A learning-free method never computes with the device or precision (only calibration does), so
    neither is part of its identity: a bf16 rerun of WALLA does not make UniformAvg's runs a second row.
    """
    module = method_module(mp.name)
    cfg = module.resolve(mp.config, data) if hasattr(module, "resolve") else mp.config
    calibration = to_dict(plan.calibration) if plan.calibrated else None
    uses_env = mp.info.group != "learning_free" or calibration is not None
    key = run_key(
        data_inputs_id(data, to_dict(plan.spec)),
        mp.name,
        to_dict(cfg),
        calibration=calibration,
        precision=env.precision if uses_env else None,
        device=env.device if uses_env else None,
        init=continued.init if continued else "default init",
        base_inputs_id=continued.base_key["scenario_inputs_id"] if continued else None,
    )
    return cfg, key
