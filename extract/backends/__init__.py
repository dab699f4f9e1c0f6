"""Extraction backends: `hf` (transformers; CPU or GPU), `vllm` (GPU or CPU; its own venv), `dummy` (seeded, for tests).

No base class (STYLE item 12): each backend is a plain class with the same few methods, documented
by the `Backend` Protocol below, and duplicates code freely.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

BACKENDS = ("hf", "vllm", "dummy")


@dataclass
class ScoreResult:
    """Outputs for a list of prompts, in the input order."""

    raw_logprobs: np.ndarray  # [N, U] float32 full-vocabulary log-probs of the U candidate tokens
    hidden: np.ndarray  # [N, H] float32 last-layer hidden state (after final norm) at the last prompt token
    prompt_nll: np.ndarray  # [N] float32 mean next-token NLL over the prompt's real tokens
    n_tokens: np.ndarray  # [N] int32 prompt length in tokens (incl. BOS when the tokenizer adds one)


Progress = Callable[[int, int], None]  # (rows done in this batch, tokens in this batch)


class Backend(Protocol):
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
        """One forward pass per prompt; rows come back in input order."""
        ...

    def close(self) -> None: ...
