"""Extraction backends: what walla extract asks of a model, as two Protocols and the data they exchange.

- `BackendKind`: one registered way to run a model (extract/backends/registry.py: `hf`, `vllm`; tests add
  the seeded fake `dummy`). A kind is four things: its own `Options` (a config dataclass through the one
  validator, filled from `--backend-arg key=value` and a model's manifest `backend_args`), `settle`,
  which decides everything once (dtype, compile, batching, sizes, device) and returns a `Settled`,
  `recorded_options`, its inverse (the options that settle to a recorded identity), and
  `load(settled) -> Backend`. The fingerprint of a feature set is `Settled.identity`: what settle decided
  is what the key records, so a setting cannot change the numbers without changing the key.
- `Backend`: a loaded model. walla extract prepares a variant's prompts with it (chat template, option
  token ids) and scores them range by range (extract/variant.py), then closes it.

No base class (STYLE item 12): each backend is a plain class with these few methods and duplicates
code freely; `Settled` carries every decided setting, so a kind and its worker copies (Ray actors)
need nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # annotations only: models pulls the hub and zarr, numpy ~0.3 s, into every config error
    import numpy as np
    from walla.extract.models import ResolvedModel


@dataclass
class ScoreResult:
    """Outputs for a list of prompts, in the input order."""

    raw_logprobs: np.ndarray  # [N, U] float32 full-vocabulary log-probs of the U candidate tokens
    hidden: np.ndarray  # [N, H] float32 last-layer hidden state (after final norm) at the last prompt token
    prompt_nll: np.ndarray  # [N] float32 mean next-token NLL over the prompt's real tokens
    n_tokens: np.ndarray  # [N] int32 prompt length in tokens (incl. BOS when the tokenizer adds one)


Progress = Callable[[int, int], None]  # (rows done in this batch, tokens in this batch)

# the identity key holding the batch sizes where outputs depend on batch composition
BATCHING_KEY = "batching"
# determinism tiers (Settled.tier), written into every feature set's fingerprint inputs as `determinism`
TIERS = ("bitwise", "batch-recorded", "tolerance")
TIER_KEY = "determinism"


@dataclass(frozen=True)
class BackendRequest:
    """What a run asks of a backend, before anything is decided (flat: no config object).

    `None` sizes are `auto`; the kind's own settings are its `Options`, passed to `settle` beside this.
    """

    model: ResolvedModel
    dtype: str  # a --dtype value (`auto`: measured by settle)
    device: str  # cpu | cuda | cuda:N | mps
    chat_template: bool
    hidden_size: int | None  # the manifest's (checked against the loaded model; the fake's width)
    batch_tokens: int | None = None  # padded tokens per forward pass; None: auto (extract/sizing.py)
    shard_rows: int | None = None  # rows per scoring call and durable shard; None: auto
    est_tokens: Callable[[], int] | None = field(default=None, compare=False)  # job's prompt tokens (lazy)


@dataclass(frozen=True)
class Settled:
    """Everything a kind decided for one request: what loads, what the fingerprint records, and why.

    `identity` is the backend's whole share of a feature set's fingerprint (the model's identity
    included); nothing else adds to it. `environment` names the identity keys the machine decides (device,
    accelerator, library versions), `derived` those that follow from them through `auto` (tier, batching):
    a store set that differs from this one in those alone was made elsewhere (extract/run.py refuses it).
    """

    kind: str  # the registry name
    request: BackendRequest  # as asked, with the dtype and sizes settled (re-settling it gives `identity`)
    options: Any  # the kind's Options with every `auto` decided
    tier: str  # one of TIERS
    identity: dict
    why: tuple[str, ...]  # one line per decision, printed by walla extract
    command_args: tuple[str, ...]  # the options after `--backend NAME` that re-create the same bytes
    environment: tuple[str, ...] = ()
    derived: tuple[str, ...] = (TIER_KEY, BATCHING_KEY)

    @property
    def model(self) -> ResolvedModel:
        return self.request.model

    @property
    def device(self) -> str:
        return self.request.device

    @property
    def dtype(self) -> str:
        return self.request.dtype

    @property
    def batch_tokens(self) -> int:
        return int(self.request.batch_tokens or 0)

    @property
    def shard_rows(self) -> int:
        return int(self.request.shard_rows or 0)

    def recorded(self) -> dict:
        """The sizes to settle again with, elsewhere (a Ray worker) or later (a resume)."""
        return {"batch_tokens": self.batch_tokens, "shard_rows": self.shard_rows}


class Backend(Protocol):
    """A loaded model: the operations extract/variant.py builds a feature set from, and close()."""

    name: str
    hidden_size: int
    load_times: dict[str, float]  # where the load's seconds went (printed on the load line; may be empty)
    n_params: int | None  # non-embedding parameters (compute accounting); None: unknown

    def format_prompt(self, text: str) -> str:
        """Raw text, or the model's chat template around it when asked."""
        ...

    def encode(self, text: str) -> list[int]:
        """Token ids exactly as a (formatted) prompt is fed to the model."""
        ...

    def encode_bare(self, text: str) -> list[int]:
        """Token ids of a string alone, without special tokens (option-token fallback)."""
        ...

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """`encode` of many prompts (extract/variant.py runs it in a thread, ahead of `score`)."""
        ...

    def score(
        self,
        prompts: list[str],
        token_ids: list[int],
        progress: Progress | None = None,
        enc: list[list[int]] | None = None,
    ) -> ScoreResult:
        """One forward pass per prompt; rows come back in input order. `enc`: `encode_batch(prompts)`."""
        ...

    def close(self) -> None: ...


class BackendKind(Protocol):
    """A registered way to run a model; every method but `load` works without loading anything."""

    name: str  # the --backend value
    Options: type  # its --backend-arg keys: a walla.manifests.validate `@config` class

    def usable(self) -> tuple[bool, str]:
        """(True, "") when it can run on this machine, else (False, why in one line)."""
        ...

    def default_device(self) -> str:
        """The device used without --device."""
        ...

    def check_device(self, device: str) -> None:
        """Raise ValueError (one line) for a device this machine cannot give this backend."""
        ...

    def pin_model(self, model: ResolvedModel) -> ResolvedModel:
        """The model as the fingerprint records it (a hub revision resolved to its commit sha).

        Raises:
            hub.HubUnavailableError: the hub cannot say which commit the revision is.
        """
        ...

    def settle(self, request: BackendRequest, options: Any, recorded: dict | None = None) -> Settled:
        """Decide dtype, compile, batching, sizes and device once; `recorded` sizes replace `auto` ones
        (those a store's feature set or the driver of a Ray run settled with)."""
        ...

    def recorded_options(self, identity: dict) -> dict:
        """The `--backend-arg` settings that settle to this recorded identity again (with its `batching`
        as `recorded`): walla serve reopens a feature set's model with them."""
        ...

    def gpus_per_worker(self, settled: Settled) -> int:
        """GPUs one Ray actor holds when the device is a GPU."""
        ...

    def load(self, settled: Settled) -> Backend:
        """Load the model (once per process) and return it ready to score."""
        ...


class CheckpointKind:
    """What every kind that runs a real checkpoint on this machine (hf, vllm) does alike: the devices
    extract/device.py finds here, and a hub revision pinned to its commit (extract/models)."""

    def default_device(self) -> str:
        from walla.extract import device

        return device.default_device()

    def check_device(self, device: str) -> None:
        from walla.extract import device as devices

        devices.check_device(device)

    def pin_model(self, model: ResolvedModel) -> ResolvedModel:
        from walla.extract.models import pin_revision

        return pin_revision(model)
