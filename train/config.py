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
from walla.manifests.validate import config, option

FIRST_SEED = 18  # SPEC §4.5: repeat r uses seed 18 + r
LOGGERS = ("csv", "tensorboard", "wandb")  # train/loggers.py's (a test keeps them equal)
# Lightning's names and their short forms (train/engine/_fabric.py PRECISIONS, PRECISION_ALIASES; a test keeps them equal)
PRECISIONS = ("auto", "32-true", "64-true", "bf16-mixed", "16-mixed", "bf16-true", "32", "64", "bf16", "16")


def _comma_list(value: Any, option: str) -> Any:
    """'a, b' -> ('a', 'b'); a list or None passes through (an empty list is an error)."""
    if isinstance(value, str):
        value = tuple(v.strip() for v in value.split(",") if v.strip())
        if not value:
            raise ValueError(f"{option}: empty list")
    return value


@config
class TrainConfig:
    scenario: str = option(
        help="a manifest name or YAML path, or a kind built from the store: hetero | homo | hetero-context (walla ls scenarios)"
    )
    # the kinds only (train/kinds.py)
    dataset: str | None = option(None, "hetero/homo/hetero-context: the dataset (default: the store's one)")
    models: tuple[str, ...] | None = option(
        None, "hetero/hetero-context: comma-separated models (default: every model extracted)", metavar="A,B"
    )
    model: str | None = option(None, "homo: the model copied into every slot")
    agents: int | None = option(None, "homo: how many copies")
    irrelevant: bool = option(False, "hetero-context: one more agent sees another question's context")
    eval_dataset: str | None = option(
        None, "hetero/homo/hetero-context: test on every row of this dataset (out of distribution)"
    )
    preset: str | None = option(
        None,
        "hetero/homo/hetero-context: demo | paper hyper-parameters (default: demo iff every agent is an embedded model)",
    )
    # agents join or leave a trained scenario (train/join.py)
    add_agent: tuple[str, ...] = option((), "a model joins the trained scenario (repeatable)", repeat=True)
    drop_agent: tuple[str, ...] = option(
        (), "the last agent of this model leaves the scenario (repeatable)", repeat=True
    )
    from_scratch: bool = option(False, "with --add/--drop-agent: train every head anew instead of continuing")
    join_epochs: int = option(1, "with --add/--drop-agent: passes over the training stream when continuing")
    # what runs (None: the scenario's own)
    methods: tuple[str, ...] | None = option(
        None, "comma-separated method names (default: the scenario's; walla ls methods)", metavar="A,B"
    )
    seeds: int | None = option(None, "number of seeds 18, 19, ... (default: the scenario's)")
    seed_list: tuple[int, ...] | None = option(
        None, "explicit seeds, e.g. 18,19", metavar="S,S", cli_type=str
    )
    sets: tuple[str, ...] = option(
        (),
        "hyper-parameter override, e.g. walla.lr=1e-4 (repeatable)",
        flag="--set",
        metavar="M.KEY=VALUE",
        repeat=True,
    )
    calibrated: bool | None = option(
        None,
        "calibrate every agent first (SPEC §9; default: the scenario's)",
        flag="--calibrated/--uncalibrated",
    )
    save_states: str | None = option(
        None,
        "methods whose runs write state.pt (for --add-agent and walla market): all, or names or families, e.g. "
        "walla-i or walla (default: none; predictions are always written)",
    )
    # where and how
    store: str = option("walla-store", "feature store: a directory or an fsspec URL (s3://...)")
    runs: Path = option(Path("runs"), "runs root")
    device: str = option("cpu", "cpu | cuda | cuda:N | mps | auto")
    precision: str = option(
        "32-true", "Lightning precision: 32-true | bf16-mixed | 16-mixed | 64-true | bf16-true | auto"
    )
    logger: str = option("csv", "csv (always written) | tensorboard | wandb")
    force: bool = option(False, "rerun finished runs")
    limit_rows: int | None = option(None, "keep about N rows, split shares kept (quick tries)")
    show_plan: bool = option(False, "print the resolved plan as YAML and exit")

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
        if self.logger not in LOGGERS:
            problems.append(f"--logger must be one of {', '.join(LOGGERS)}, got {self.logger!r}")
        if self.precision.strip().lower() not in PRECISIONS:
            problems.append(f"--precision must be one of {' | '.join(PRECISIONS)}, got {self.precision!r}")
        kind, _, index = self.device.lower().partition(":")
        if kind not in ("auto", "cpu", "cuda", "mps") or (index and (kind != "cuda" or not index.isdigit())):
            problems.append(f"--device must be auto | cpu | cuda | cuda:N | mps, got {self.device!r}")
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
