"""The one door from a config to a loaded model: `walla extract`, `walla check`, the market's agents and
`walla serve` all open a model here, so each runs and fingerprints it the same way.

    settled, backend = open_for(ExtractConfig(model="smollm2-135m", dataset="facts"))
    settled, backend = open_for(cfg, expect=recorded_identity)   # one line naming the field that differs
    cfg = recorded_config("smollm2-135m", "facts", recorded_identity, device=None)  # reopen as recorded
    target = target_for(cfg); settled = settle_for(cfg, target)  # decide only (walla extract, before resume)

Three steps, each a plain function: `target_for` resolves what the config names (the model's catalog entry
and files, the backend kind — `--backend`, else the model's manifest hint, else hf — and the device);
`settle_for` decides everything about running it (extract/backends/registry.py `settle_backend`: dtype,
compile, batch invariance, batch sizes; `Settled.identity` is what a feature set's fingerprint records);
`open_for` loads what was settled. Nothing here compares a backend's name.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from walla.extract.backends import Backend, BackendKind, BackendRequest, Settled
from walla.extract.backends.registry import (
    DEFAULT_BACKEND,
    backend_kind,
    backend_names,
    identity_difference,
    open_backend,
    recorded_options,
    settle_backend,
    unknown_backend,
)
from walla.extract.config import ExtractConfig
from walla.extract.models import ResolvedModel, resolve_model
from walla.manifests import catalog  # module attribute: tests swap catalog.load_models

log = logging.getLogger(__name__)


class IdentityMismatch(ValueError):
    """The identity settled here is not the one asked for (another device kind, model file, library)."""


@dataclass(frozen=True)
class Target:
    """What a config names, resolved: the model's catalog name and entry, its files, the backend kind that
    runs it and the device. `model` is pinned (a hub revision resolved to its commit) unless asked not to be."""

    name: str
    entry: catalog.ModelEntry
    kind: BackendKind
    device: str
    model: ResolvedModel


def choose_backend(cfg: ExtractConfig, model_entry) -> BackendKind:
    """--backend, else the manifest hint; a hinted backend that cannot run here falls back to the default (hf)."""
    if cfg.backend:
        return backend_kind(cfg.backend)
    hint = model_entry.backend or DEFAULT_BACKEND
    if hint not in backend_names():  # models.yaml names any string; the registry is the one list
        raise KeyError(f"models.yaml: {model_entry.name}.backend: {unknown_backend(hint)}")
    kind = backend_kind(hint)
    ok, why = kind.usable()
    if not ok:
        log.info(
            "model %s prefers the %s backend, but %s: using %s",
            model_entry.name,
            kind.name,
            why,
            DEFAULT_BACKEND,
        )
        return backend_kind(DEFAULT_BACKEND)
    return kind


def backend_args(cfg: ExtractConfig, model_entry, kind: str) -> dict:
    """The backend's own options: the model's manifest `backend_args` (for its hinted backend), then --backend-arg."""
    manifest = dict(model_entry.backend_args) if model_entry.backend == kind else {}
    return {**manifest, **cfg.backend_args}


def target_for(cfg: ExtractConfig, *, check_device: bool = True, pin: bool = True) -> Target:
    """Resolve the config's model, backend kind and device. `check_device=False` where other machines run it
    (a Ray driver: the workers check theirs); `pin=False` where the caller pins (walla extract pins together
    with loading the dataset, so a hub that serves neither says so once).

    Raises:
        KeyError: unknown model or backend (close matches named). ValueError: a device this machine lacks.
        hub.HubUnavailableError: `pin` and the hub cannot say which commit the revision is.
    """
    name, entry = catalog.resolve_model_name(cfg.model, catalog.load_models())
    kind = choose_backend(cfg, entry)
    device = cfg.device or kind.default_device()
    if check_device:
        kind.check_device(device)
    model = resolve_model(entry)
    return Target(name, entry, kind, device, kind.pin_model(model) if pin else model)


def settle_for(
    cfg: ExtractConfig,
    target: Target | None = None,
    *,
    est_tokens: Callable[[], int] | None = None,
    recorded: dict | None = None,
) -> Settled:
    """What the target's backend settles for this config (nothing loads). `recorded`: batch sizes a store's
    sets of the same inputs were made with, reused rather than measured again.

    Raises:
        ConfigError: a bad --backend-arg / manifest backend_args. ValueError: a setting the kind refuses.
    """
    t = target or target_for(cfg)
    entry = t.entry
    request = BackendRequest(
        model=t.model,
        dtype=cfg.dtype or entry.dtype or "auto",
        device=t.device,
        chat_template=entry.chat_template if cfg.chat_template is None else cfg.chat_template,
        hidden_size=entry.hidden_size,
        batch_tokens=cfg.batch_tokens,  # None: auto, settled by the kind
        shard_rows=cfg.shard_rows,
        est_tokens=est_tokens,
    )
    return settle_backend(t.kind.name, request, backend_args(cfg, entry, t.kind.name), recorded)


def open_for(
    cfg: ExtractConfig,
    target: Target | None = None,
    *,
    expect: Mapping | None = None,
    recorded: dict | None = None,
) -> tuple[Settled, Backend]:
    """Settle and load the config's model. `expect`: the identity a feature set recorded (a served or
    replayed run's): anything else stops here, before the weights load, with one line naming the field.

    Raises:
        IdentityMismatch: `expect` and this machine settles another identity. And what `settle_for` raises.
    """
    settled = settle_for(cfg, target, recorded=recorded)
    if expect is not None:
        diff = identity_difference(dict(expect), settled.identity)
        if diff:
            raise IdentityMismatch(
                f"model {cfg.model}: this machine settles another identity than the feature set recorded: {diff} "
                "(recorded != here): run it where the set was extracted, or extract the set here"
            )
    return settled, open_backend(settled)


def with_pinned(target: Target, model: ResolvedModel) -> Target:
    """The same target with its model as pinned by the caller."""
    return dataclasses.replace(target, model=model)


def recorded_config(name: str, dataset: str, identity: Mapping, device: str | None) -> ExtractConfig:
    """The config that opens model `name` as a feature set recorded it (`walla serve`, `walla market agent`):
    its backend, device (unless `device`), dtype and the options its backend kind says settle to `identity`
    (the registry's `recorded_options`); a local model is its recorded directory.

    Raises:
        ValueError: the identity names a backend not registered here (one line).
    """
    try:
        args = recorded_options(identity)
    except KeyError as e:
        raise ValueError(
            f"{name}: its feature set recorded backend {identity.get('backend')!r}: {e.args[0]}"
        ) from None
    model = identity.get("model") or {}
    return ExtractConfig(
        model=model.get("path") if model.get("source") == "local" else name,
        dataset=dataset,
        backend=identity.get("backend"),
        device=device or identity.get("device"),
        dtype=identity.get("dtype"),
        backend_args=args,
    )
