"""The backend registry and the one door to a backend: the only list of `--backend` names.

    settled = settle_backend("hf", request, {"compile": "on"})   # decide everything; nothing loads
    backend = open_backend(settled)                             # load what was decided
    register_backend(DUMMY)                                     # tests/conftest.py: the seeded fake

walla extract (extract/run.py), `walla check` (extract/parity.py), every Ray worker (extract/distributed.py)
and the market agent (market/agent.py) go through these two functions, so they run and fingerprint a model
the same way. A new backend is a module with a kind object (extract/backends/__init__.py: `BackendKind`:
its `Options`, `settle`, `load`) and one entry here; nothing else lists backend names (the catalog, the
CLI and `walla check` ask `backend_names()`). Kinds are imported on first use (lm-eval's lazy registry),
so listing the names imports no torch.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Mapping
from typing import Any

from walla.extract.backends import Backend, BackendKind, BackendRequest, Settled
from walla.manifests.validate import build

# name -> "module:attribute" of its kind object (imported on first use), or the kind object itself
BACKEND_KINDS: dict[str, str | BackendKind] = {
    "hf": "walla.extract.backends.hf._kind:HF",
    "vllm": "walla.extract.backends.vllm._backend:VLLM",
}
DEFAULT_BACKEND = "hf"  # a model without a backend hint, or whose hinted backend cannot run here


def backend_names() -> list[str]:
    """The registered names, in registration order (no kind is imported)."""
    return list(BACKEND_KINDS)


def unknown_backend(name: str) -> str:
    """The one-line message for a name that is not registered (close matches, then every name)."""
    close = difflib.get_close_matches(name, backend_names(), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return f"unknown backend {name!r}{hint} (available: {', '.join(backend_names())})"


def backend_kind(name: str) -> BackendKind:
    """The registered kind called `name` (imported now if it was not yet).

    Raises:
        KeyError: unknown name; the message suggests close matches and lists the registered ones.
    """
    if name not in BACKEND_KINDS:
        raise KeyError(unknown_backend(name))
    kind = BACKEND_KINDS[name]
    if isinstance(kind, str):
        module, _, attr = kind.partition(":")
        kind = BACKEND_KINDS[name] = getattr(importlib.import_module(module), attr)
    return kind


def register_backend(kind: BackendKind) -> None:
    """Add a backend kind under its name (a second, different kind with the same name is an error)."""
    have = BACKEND_KINDS.get(kind.name, kind)
    if have is not kind and not (isinstance(have, str) and backend_kind(kind.name) is kind):
        raise ValueError(f"backend {kind.name!r} is registered already ({BACKEND_KINDS[kind.name]!r})")
    BACKEND_KINDS[kind.name] = kind


def backend_options(name: str, args: Mapping[str, Any] | None, where: str = "--backend-arg") -> Any:
    """The kind's `Options` from `key=value` settings (CLI strings or manifest values), checked by the one
    validator: an unknown key or a bad value is one line naming it and what the kind allows.

    Raises:
        KeyError: unknown backend. manifests.validate.ConfigError: a bad key or value.
    """
    return build(backend_kind(name).Options, dict(args or {}), where=f"{where} (backend {name})")


def settle_backend(
    name: str, request: BackendRequest, args: Mapping[str, Any] | None = None, recorded: dict | None = None
) -> Settled:
    """Decide everything about running `request` on backend `name` (its `settle`); nothing loads.

    Raises:
        KeyError: unknown backend. ConfigError: bad `args`. ValueError: a setting the kind refuses.
    """
    return backend_kind(name).settle(request, backend_options(name, args), recorded)


def recorded_options(identity: Mapping) -> dict:
    """The `--backend-arg` settings that settle the backend that recorded `identity` (its `backend`) to it
    again: that kind's `recorded_options`.

    Raises:
        KeyError: the identity names no registered backend.
    """
    return backend_kind(str(identity.get("backend"))).recorded_options(dict(identity))


def open_backend(settled: Settled, *, resettle: bool = False) -> Backend:
    """Load what `settled` decided. With `resettle` (a Ray worker: another process, maybe another machine),
    settle the same request here first: a different identity stops with one line naming the field.

    Raises:
        ValueError: `resettle` and this process settles another identity (e.g. another GPU model).
    """
    kind = backend_kind(settled.kind)
    if resettle:
        here = kind.settle(settled.request, settled.options, settled.recorded())
        diff = identity_difference(settled.identity, here.identity)
        if diff:
            raise ValueError(
                f"this worker settles backend {settled.kind} to another identity than the driver: {diff} "
                "(driver's != this worker's): the driver and every worker must settle alike (same device kind and "
                "model, same library versions; a driver that sees no GPU cannot name one: run it on a GPU node)"
            )
    return kind.load(settled)


def identity_difference(a: Mapping, b: Mapping, prefix: str = "") -> str | None:
    """The first field (sorted, dotted path) where two identities differ, as `path: a_value != b_value`."""
    for key in sorted(set(a) | set(b)):
        path = f"{prefix}{key}"
        va, vb = a.get(key), b.get(key)
        if isinstance(va, Mapping) and isinstance(vb, Mapping):
            inner = identity_difference(va, vb, f"{path}.")
            if inner:
                return inner
        elif va != vb:
            return f"{path}: {va!r} != {vb!r}"
    return None
