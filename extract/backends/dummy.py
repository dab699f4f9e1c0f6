"""Dummy backend: seeded pseudo log-probs and hidden states, no model (lm-eval DummyLM style).

For fast integration tests of extract -> store -> train -> evaluate. It is not in the backend
registry users see: the tests register `DUMMY` (tests/conftest.py), which makes `--backend dummy`
available to them. Everything is a
deterministic function of (seed, prompt text), so it is independent of batching and order, and
a `relevant` prompt differs from the `none` one. Tokenization is word-level (`\\s*\\w+` or one
punctuation mark, ids by crc32), enough for the option-token resolution rules of SPEC §1.5.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import replace

import numpy as np
from walla.extract import sizing
from walla.extract.backends import TIER_KEY, BackendRequest, Progress, ScoreResult, Settled
from walla.extract.device import check_device_name
from walla.extract.models import ResolvedModel
from walla.extract.scoring import plan_batches
from walla.manifests.validate import config

_TOKEN = re.compile(r"\s*\w+|\s*[^\w\s]|\s+$")
VOCAB = 50_000


class DummyBackend:
    name = "dummy"

    def __init__(
        self, hidden_size: int = 16, seed: int = 0, batch_tokens: int = 4096, sharpness: float = 2.0
    ):
        self.hidden_size = int(hidden_size or 16)
        self.seed = int(seed)
        self.batch_tokens = batch_tokens
        self.sharpness = sharpness  # std of the candidate logits: larger = more confident fake answers
        self.load_times: dict[str, float] = {}
        self.n_params: int | None = None

    def identity(self) -> dict:
        """What its numbers depend on (DummyKind.settle puts it in the fingerprint)."""
        return dict(backend="dummy", hidden_size=self.hidden_size, seed=self.seed, sharpness=self.sharpness)

    def format_prompt(self, text: str) -> str:
        return text

    def encode(self, text: str) -> list[int]:
        return [zlib.crc32(t.encode()) % VOCAB for t in _TOKEN.findall(text)]

    def encode_bare(self, text: str) -> list[int]:
        return self.encode(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def _rng(self, text: str, token: int = 0) -> np.random.Generator:
        return np.random.default_rng([self.seed, zlib.crc32(text.encode()), token])

    def score(
        self,
        prompts: list[str],
        token_ids: list[int],
        progress: Progress | None = None,
        enc: list[list[int]] | None = None,
    ) -> ScoreResult:
        n, u = len(prompts), len(token_ids)
        raw = np.empty((n, u), dtype=np.float32)  # [N, U]
        hidden = np.empty((n, self.hidden_size), dtype=np.float32)  # [N, H]
        nll = np.empty(n, dtype=np.float32)
        ntok = np.empty(n, dtype=np.int32)
        lengths = [len(e) for e in (self.encode_batch(prompts) if enc is None else enc)]
        for idx in plan_batches(lengths, self.batch_tokens):
            for i in idx:
                p = prompts[i]
                rng = self._rng(p)
                hidden[i] = rng.standard_normal(self.hidden_size)
                nll[i] = rng.uniform(1.0, 5.0)
                ntok[i] = max(1, lengths[i])
                # one draw per (prompt, token): a token's log-prob does not depend on which others are asked;
                # log_sigmoid(.) - log(32) keeps the mass of up to 26 option tokens below 1
                logits = np.array([self._rng(p, t).standard_normal() * self.sharpness for t in token_ids])
                raw[i] = -np.logaddexp(0.0, -logits) - np.log(32.0)
            if progress is not None:
                progress(len(idx), int(sum(lengths[j] for j in idx)))
        return ScoreResult(raw, hidden, nll, ntok)

    def close(self) -> None:
        pass


@config
class DummyOptions:
    """`--backend-arg` keys of the fake (tests)."""

    seed: int = 0  # seeds every draw
    sharpness: float = 2.0  # std of the candidate logits


class DummyKind:
    """The fake as a backend kind: no weights, no hub, no dtype; every row is a function of its prompt and
    seed, so its tier is `bitwise` and its identity is its seed, width and sharpness (and the device)."""

    name = "dummy"
    Options = DummyOptions

    def usable(self) -> tuple[bool, str]:
        return True, ""

    def default_device(self) -> str:
        return "cpu"

    def check_device(self, device: str) -> None:
        check_device_name(device)  # a well-formed name is enough: nothing runs on it

    def pin_model(self, model: ResolvedModel) -> ResolvedModel:
        return model  # the weights are never read: no hub lookup

    def settle(self, request: BackendRequest, options: DummyOptions, recorded: dict | None = None) -> Settled:
        recorded = recorded or {}
        bt = request.batch_tokens or recorded.get("batch_tokens") or sizing.CPU_BATCH_TOKENS
        rows = request.shard_rows or recorded.get("shard_rows") or sizing.CPU_SHARD_ROWS
        fake = DummyBackend(request.hidden_size, options.seed, sharpness=options.sharpness)
        identity = {
            "model": request.model.identity,
            **fake.identity(),
            "device": check_device_name(request.device),
            TIER_KEY: "bitwise",
        }
        args = [
            a
            for k, v in (("seed", options.seed), ("sharpness", options.sharpness))
            for a in ("--backend-arg", f"{k}={v}")
        ]
        return Settled(
            kind=self.name,
            request=replace(request, batch_tokens=bt, shard_rows=rows, est_tokens=None),
            options=options,
            tier="bitwise",
            identity=identity,
            why=(),
            command_args=("--device", identity["device"], *args),
            environment=("device",),
        )

    def recorded_options(self, identity: dict) -> dict:
        return {k: identity[k] for k in ("seed", "sharpness") if k in identity}

    def gpus_per_worker(self, settled: Settled) -> int:
        return 1

    def load(self, settled: Settled) -> DummyBackend:
        o = settled.options
        return DummyBackend(settled.request.hidden_size, o.seed, settled.batch_tokens, o.sharpness)


DUMMY = DummyKind()
