"""Extraction backends: what walla-extract asks of a model, as two Protocols and the data they exchange.

- `BackendKind`: one registered way to run a model (extract/backends/registry.py: `hf`, `vllm`; tests add
  the seeded fake `dummy`). It knows, BEFORE anything loads, whether it can run here, what it adds to a
  feature set's fingerprint and to the command that re-creates it; then it loads a `Backend`.
- `Backend`: a loaded model. walla-extract prepares a variant's prompts with it (chat template, option
  token ids) and scores them range by range (extract/variant.py), then closes it.

No base class (STYLE item 12): each backend is a plain class with these few methods and duplicates
code freely; `BackendRequest` carries every resolved setting, so a kind and its worker copies (Ray
actors) need nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

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

# the identity key holding the batch sizes where outputs depend on batch composition (BackendKind.identity)
BATCHING_KEY = "batching"


@dataclass(frozen=True)
class BackendRequest:
    """Every setting a backend kind needs to identify and load one model (flat: no config object)."""

    model: ResolvedModel
    dtype: str  # a --dtype value; `auto` until the kind settles it (settle_dtype)
    device: str  # cpu | cuda | cuda:N | mps
    chat_template: bool
    hidden_size: int | None  # the manifest's (checked against the loaded model; the fake's width)
    batch_tokens: int  # padded tokens per forward pass (settled: a number, never auto)
    compile: str = "off"  # hf: auto | on | off; `auto` until the kind settles it (settle_compile)
    shard_rows: int = 256  # rows per scoring call and durable shard (settled)
    batch_invariant: str = "auto"  # hf: auto | on | off; `auto` until the kind settles it (settle_batching)
    # vllm only (None: vLLM's default)
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    enforce_eager: bool | None = None


class Backend(Protocol):
    """A loaded model: the four operations extract/variant.py builds a feature set from, and close()."""

    name: str
    hidden_size: int

    def identity(self) -> dict:
        """Fingerprint inputs of the backend itself: name, library versions, dtype, chat template."""
        ...

    def format_prompt(self, text: str) -> str:
        """Raw text, or the model's chat template around it when asked."""
        ...

    def encode(self, text: str) -> list[int]:
        """Token ids exactly as a (formatted) prompt is fed to the model."""
        ...

    def encode_bare(self, text: str) -> list[int]:
        """Token ids of a string alone, without special tokens (option-token fallback)."""
        ...

    def score(
        self, prompts: list[str], token_ids: list[int], progress: Progress | None = None
    ) -> ScoreResult:
        """One forward pass per prompt; rows come back in input order.

        A backend with `encode_batch(texts) -> ids` also takes `enc=` (those ids, computed ahead by
        extract/variant.py's background thread while the device runs the previous call).
        """
        ...

    def close(self) -> None: ...


class BackendKind(Protocol):
    """A registered way to run a model; every method but `load` works without loading anything."""

    name: str  # the --backend value

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

    def settle_dtype(self, dtype: str, device: str) -> tuple[str, str | None]:
        """(the dtype the model will run in, why; None when there is nothing to say)."""
        ...

    def settle_compile(self, mode: str, est_tokens: Callable[[], int], device: str) -> tuple[str, str | None]:
        """(the --compile mode the run uses, why; None when the backend does not compile)."""
        ...

    def settle_batching(
        self, request: BackendRequest, batch_tokens: int | None, shard_rows: int | None
    ) -> tuple[BackendRequest, str | None]:
        """The request with its batch invariance and sizes decided (`None` sizes: auto, extract/sizing.py),
        and why; None when there is nothing to say."""
        ...

    def identity(self, request: BackendRequest) -> dict:
        """Fingerprint inputs of the backend for this request (the model's own identity is added by run.py).

        A `batching` key (batch tokens, shard rows, order) is present exactly when the outputs depend on
        which prompts share a forward pass: run.py then reuses the sizes a store already recorded.
        """
        ...

    def command_args(self, request: BackendRequest) -> list[str]:
        """The options after `--backend NAME` that re-create the same bytes (e.g. `--dtype float32`)."""
        ...

    def gpus_per_worker(self, request: BackendRequest) -> int:
        """GPUs one Ray actor holds when the device is a GPU."""
        ...

    def load(self, request: BackendRequest) -> Backend:
        """Load the model (once per process) and return it ready to score."""
        ...
