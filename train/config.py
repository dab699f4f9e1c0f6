"""TrainConfig: every setting of one `walla train` command, validated in one place.

    cfg = build(TrainConfig, {"scenario": "demo-hetero-facts", "seeds": 2}, where="command line")
    run(cfg)                                                                     # train/run.py

Declared with the project's one config validator (walla.manifests.validate), as every stage's config is.
Each field is named as its `walla train` option (`--seed-list` -> seed_list; `--set` -> sets), so the
command passes its options through unchanged; comma lists (`--models a,b`) may be given as one string.
Checks that need the store, the scenario file or an installed package (unknown method, missing logger
package, device) run in the recipe, which names the option as these do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import field_validator
from walla.manifests.validate import config

FIRST_SEED = 18  # SPEC §4.5: repeat r uses seed 18 + r


def _comma_list(value: Any, option: str) -> Any:
    """'a, b' -> ('a', 'b'); a list or None passes through (an empty list is an error)."""
    if isinstance(value, str):
        value = tuple(v.strip() for v in value.split(",") if v.strip())
        if not value:
            raise ValueError(f"{option}: empty list")
    return value


@config
class TrainConfig:
    scenario: (
        str  # a manifest name or YAML path, or a kind built from the store: hetero | homo | hetero-context
    )
    # the kinds only (train/kinds.py)
    dataset: str | None = None  # None: the store's one dataset
    models: tuple[str, ...] | None = None  # hetero, hetero-context; None: every model extracted
    model: str | None = None  # homo: the model copied into every slot
    agents: int | None = None  # homo: how many copies
    irrelevant: bool = False  # hetero-context: one more agent sees another question's context
    eval_dataset: str | None = None  # test on every row of this dataset (out of distribution)
    preset: str | None = None  # demo | paper hyper-parameters; None: demo iff every agent is embedded
    # agents join or leave a trained scenario (train/join.py)
    add_agent: tuple[str, ...] = ()
    drop_agent: tuple[str, ...] = ()
    from_scratch: bool = False  # train every head anew instead of continuing from the scenario's runs
    join_epochs: int = 1  # passes over the training stream when continuing
    # what runs (None: the scenario's own)
    methods: tuple[str, ...] | None = None
    seeds: int | None = None  # N seeds 18, 19, ...
    seed_list: tuple[int, ...] | None = None  # explicit seeds
    sets: tuple[str, ...] = ()  # --set METHOD_OR_FAMILY.KEY=VALUE hyper-parameter overrides
    calibrated: bool | None = None  # calibrate every agent first (SPEC §9)
    save_states: str | None = (
        None  # methods whose runs write state.pt: all | names | families (run.states_to_save)
    )
    # where and how
    store: str = "walla-store"  # a directory or an fsspec URL (s3://...)
    runs: Path = Path("runs")
    device: str = "cpu"  # cpu | cuda | cuda:N | mps | auto
    precision: str = "32-true"  # Lightning precision: 32-true | bf16-mixed | 16-mixed | 64-true | auto
    logger: str = "csv"  # csv (always written) | tensorboard | wandb
    force: bool = False  # rerun finished runs
    limit_rows: int | None = None  # keep about N rows, split shares kept (quick tries)
    show_plan: bool = False  # print the resolved plan as YAML and stop

    @field_validator("models", "methods", mode="before")
    @classmethod
    def _names(cls, value: Any, info: Any) -> Any:
        return _comma_list(value, f"--{info.field_name}")

    @field_validator("seed_list", mode="before")
    @classmethod
    def _seeds(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return tuple(int(s) for s in value.split(",") if s.strip())
            except ValueError:
                raise ValueError(f"--seed-list: expected comma-separated integers, got {value!r}") from None
        return value

    def __post_init__(self) -> None:
        problems = []
        if self.seeds is not None and self.seed_list is not None:
            problems.append("give either --seeds N or --seed-list a,b,..., not both")
        if self.seeds is not None and self.seeds < 1:
            problems.append(f"--seeds must be >= 1, got {self.seeds}")
        if self.limit_rows is not None and self.limit_rows < 3:
            problems.append(f"--limit-rows must be >= 3, got {self.limit_rows}")
        if self.from_scratch and not (self.add_agent or self.drop_agent):
            problems.append("--from-scratch goes with --add-agent / --drop-agent")
        for item in self.sets:
            key, eq, _ = item.partition("=")
            method, dot, name = key.partition(".")
            if not (eq and dot and method and name):
                problems.append(f"--set {item!r}: expected METHOD_OR_FAMILY.KEY=VALUE, e.g. walla.lr=1.0e-4")
        if problems:
            raise ValueError("; ".join(problems))

    def seed_values(self) -> tuple[int, ...] | None:
        """The seeds asked for (None: the scenario's)."""
        if self.seed_list is not None:
            return self.seed_list
        return None if self.seeds is None else tuple(FIRST_SEED + r for r in range(self.seeds))

    def hparams(self) -> dict[str, dict[str, Any]]:
        """--set walla.lr=1e-4 --set route-llm.epochs=2 -> {"walla": {"lr": 1e-4}, "route-llm": {"epochs": 2}}."""
        out: dict[str, dict[str, Any]] = {}
        for item in self.sets:
            key, _, value = item.partition("=")
            method, _, name = key.partition(".")
            out.setdefault(method, {})[name] = yaml.safe_load(value)
        return out
