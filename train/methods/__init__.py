"""Method registry: name -> lazy "module:attr" path (nothing imported until used).

Every method module exposes two plain functions (no base class, see STYLE.md item 6):

    fit(data: ScenarioData, cfg: dict, seed: int, log: LogFn | None = None) -> state
        Train on data.split_index("train") (early stopping may use "val"); seeded fully.
        Methods without parameters return None or a small dict.
    predict(state, data: ScenarioData, rows: np.ndarray) -> MethodOutput
        Weights and aggregate for the given row indices (eval mode, no dropout).

`cfg` is the method's resolved hyper-parameter dict from the scenario manifest (SPEC §4.4 defaults).
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
    def fit(self, data: Any, cfg: dict, seed: int, log: LogFn | None = None) -> Any: ...
    def predict(self, state: Any, data: Any, rows: np.ndarray) -> MethodOutput: ...


@dataclass(frozen=True)
class MethodInfo:
    name: str
    path: str  # "walla.train.methods.<module>" exposing fit/predict
    display: str  # row label in the paper's tables
    group: str  # individual | learning_free | learning_based | walla
    defaults: dict = field(default_factory=dict)  # overrides applied before the scenario's own


REGISTRY: dict[str, MethodInfo] = {
    m.name: m
    for m in [
        MethodInfo("uniform", "walla.train.methods.uniform", "UniformAvg", "learning_free"),
        MethodInfo("self-certainty", "walla.train.methods.self_certainty", "SelfCertainty", "learning_free"),
        MethodInfo("packllm", "walla.train.methods.packllm", "PackLLM", "learning_free"),
        MethodInfo("stacked-gen", "walla.train.methods.stacked_gen", "StackedGen", "learning_based"),
        MethodInfo("route-llm", "walla.train.methods.route_llm", "RouteLLM", "learning_based"),
        MethodInfo(
            "route-llm-ctx",
            "walla.train.methods.route_llm",
            "RouteLLM (ctx)",
            "learning_based",
            {"with_context": True},
        ),
        MethodInfo("router-dc", "walla.train.methods.router_dc", "RouterDC", "learning_based"),
        MethodInfo(
            "router-dc-ctx",
            "walla.train.methods.router_dc",
            "RouterDC (ctx)",
            "learning_based",
            {"with_context": True},
        ),
        MethodInfo("nirt-router", "walla.train.methods.nirt_router", "NIRTRouter", "learning_based"),
        MethodInfo(
            "nirt-router-ctx",
            "walla.train.methods.nirt_router",
            "NIRTRouter (ctx)",
            "learning_based",
            {"with_context": True},
        ),
        MethodInfo("walla-i", "walla.train.methods.walla", "WALLA I", "walla", {"variant": "I"}),
        MethodInfo("walla-ii", "walla.train.methods.walla", "WALLA II", "walla", {"variant": "II"}),
        MethodInfo(
            "walla-i-log",
            "walla.train.methods.walla",
            "WALLA I (log pool)",
            "walla",
            {"variant": "I", "pooling": "log"},
        ),
        MethodInfo(
            "walla-i-cal",
            "walla.train.methods.walla",
            "WALLA I (calibrated)",
            "walla",
            {"variant": "I", "calibrated": True},
        ),
    ]
}


def get_method(name: str) -> tuple[MethodInfo, Any]:
    """Return (info, module) for a registered method; unknown names get close-match suggestions."""
    if name not in REGISTRY:
        close = difflib.get_close_matches(name, REGISTRY, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise KeyError(f"unknown method {name!r}.{hint} Available: {', '.join(REGISTRY)}")
    info = REGISTRY[name]
    return info, importlib.import_module(info.path)
