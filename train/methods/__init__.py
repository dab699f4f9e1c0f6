"""Method registry, the one list of methods: name -> module path (nothing imported until used), display
name, table group, whether it routes (evaluate/compute.py counts only the agents a router runs) and
whether it runs by default (a scenario whose `train:` names no methods; `methods: all` runs every one).

Every method module exposes (no base class, see STYLE.md item 6):

    Config                                          # @config dataclass of its hyper-parameters
    fit(data, cfg: Config, seeds, env: TrainEnv, logs) -> list[state]   # one state per seed
    predict(state, data, rows, env: TrainEnv) -> MethodOutput           # eval mode, no dropout
    resolve(cfg, data) -> Config                    # optional: data-dependent fields, for run.json

A method's `family` is the module it lives in ("walla" for walla-i, walla-ii, walla-i-log, walla-i-cal):
scenario files set hyper-parameters per family or per method name (train/plan.py). A new method is one
module and one line here; no scenario file lists the methods by hand.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

LogFn = Callable[[dict[str, float]], None]  # called once per training batch with metric values


@dataclass
class MethodOutput:
    weights: np.ndarray  # [n, M] float32, rows sum to 1 (aggregation weights)
    agg_probs: np.ndarray  # [n, K] float32, the pooled prediction
    extras: dict[str, np.ndarray] = field(default_factory=dict)
    # optional extras, each [n, M]: "wagers", "payouts", "advantage", "pred_score", "pred_baseline";
    # "agent_probs" [n, M, K] when the method changed the agents' probs (calibration).


class Method(Protocol):
    Config: type

    def fit(self, data: Any, cfg: Any, seeds: Any, env: Any, logs: Any) -> list[Any]: ...
    def predict(self, state: Any, data: Any, rows: np.ndarray, env: Any) -> MethodOutput: ...


@dataclass(frozen=True)
class MethodInfo:
    name: str
    path: str  # "walla.train.methods.<module>" exposing fit/predict
    display: str  # row label in the paper's tables (plan.MethodPlan.display adds pooling/calibration)
    group: str  # individual | learning_free | learning_based | walla
    defaults: dict = field(default_factory=dict)  # what defines this method within its family
    router: bool = False  # routes each question to agents: it needs to run only those with a weight > 0
    default: bool = True  # runs when a scenario's `train:` names no methods (`methods: all` runs every one)

    @property
    def family(self) -> str:
        """'walla.train.methods.route_llm' -> 'route-llm' (the module a method lives in)."""
        return self.path.rsplit(".", 1)[-1].replace("_", "-")


# The one list of methods, in the order of the paper's table rows (and of every plan).
REGISTRY: dict[str, MethodInfo] = {
    m.name: m
    for m in [
        MethodInfo("uniform", "walla.train.methods.uniform", "UniformAvg", "learning_free"),
        MethodInfo("self-certainty", "walla.train.methods.self_certainty", "SelfCertainty", "learning_free"),
        MethodInfo("packllm", "walla.train.methods.packllm", "PackLLM", "learning_free"),
        MethodInfo("stacked-gen", "walla.train.methods.stacked_gen", "StackedGen", "learning_based"),
        MethodInfo("route-llm", "walla.train.methods.route_llm", "RouteLLM", "learning_based", router=True),
        MethodInfo(
            "route-llm-ctx",
            "walla.train.methods.route_llm",
            "RouteLLM (ctx)",
            "learning_based",
            {"with_context": True},
            router=True,
            default=False,
        ),
        MethodInfo("router-dc", "walla.train.methods.router_dc", "RouterDC", "learning_based", router=True),
        MethodInfo(
            "router-dc-ctx",
            "walla.train.methods.router_dc",
            "RouterDC (ctx)",
            "learning_based",
            {"with_context": True},
            router=True,
            default=False,
        ),
        MethodInfo(
            "nirt-router", "walla.train.methods.nirt_router", "NIRTRouter", "learning_based", router=True
        ),
        MethodInfo(
            "nirt-router-ctx",
            "walla.train.methods.nirt_router",
            "NIRTRouter (ctx)",
            "learning_based",
            {"with_context": True},
            router=True,
            default=False,
        ),
        # beyond the paper: the nearest published per-agent confidence weighting (arXiv 2507.23167)
        MethodInfo("lens", "walla.train.methods.lens", "LENS (beyond the paper)", "learning_based"),
        MethodInfo("walla-i", "walla.train.methods.walla", "WALLA I", "walla", {"variant": "I"}),
        MethodInfo("walla-ii", "walla.train.methods.walla", "WALLA II", "walla", {"variant": "II"}),
        MethodInfo(
            "walla-i-log", "walla.train.methods.walla", "WALLA I", "walla", {"variant": "I", "pooling": "log"}
        ),
        MethodInfo(
            "walla-i-cal",
            "walla.train.methods.walla",
            "WALLA I",
            "walla",
            {"variant": "I", "calibrated": True},
        ),
        # the reference's walla_v1_augmented (SPEC §5.3; the paper's headline 4-model runs use it): WALLA I plus
        # two diagnostic heads per agent predicting its own score and its leave-one-out baseline, trained beside
        # the wager head, never read by a wager (its wagers are WALLA I's function class; its own fit)
        MethodInfo(
            "walla-i-aug",
            "walla.train.methods.walla",
            "WALLA I",
            "walla",
            {"variant": "I", "diagnostics": True},
        ),
    ]
}
ALL = "all"  # `methods: all` in a scenario file (or `--methods all`): every registered method


def default_methods() -> tuple[str, ...]:
    """The methods a scenario runs when its `train:` section names none, in registry order."""
    return tuple(name for name, info in REGISTRY.items() if info.default)


def get_method(name: str) -> tuple[MethodInfo, Any]:
    """Return (info, module) for a registered method; unknown names get close-match suggestions."""
    if name not in REGISTRY:
        close = difflib.get_close_matches(name, REGISTRY, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise KeyError(f"unknown method {name!r}.{hint} Available: {', '.join(REGISTRY)}")
    info = REGISTRY[name]
    return info, importlib.import_module(info.path)


def method_module(name: str) -> Any:
    """The module of a registered method (KeyError with suggestions for unknown names)."""
    return get_method(name)[1]
