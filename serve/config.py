"""ServeConfig: every setting of one `walla serve` command, validated in one place, before anything loads.

    cfg = build(ServeConfig, {"scenario": "demo-hetero-facts", "max_batch": 8}, where="command line")
    pool = load_pool(cfg)                                                          # serve/loading.py

Each field is also its `walla serve` option (cli/options.py generates them: `--open` -> open_access), so the
option, its default and its help are written once. This module imports nothing heavier than pydantic: a
bad option answers before the server stack, torch or a model is imported.
"""

from __future__ import annotations

from pathlib import Path

from walla.manifests.validate import config, option


@config
class ServeConfig:
    # the run (train/runs/_choice.py) and what it was trained from
    scenario: str = option(help="a trained scenario")
    runs: Path = option(Path("runs"), "runs root (walla train --runs)")
    store: Path = option(Path("walla-store"), "the feature store it was trained from")
    method: str = option("walla-i", "a WALLA method with saved heads (--save-states)")
    seed: int | None = option(None, "the run's seed (default: the key's smallest)")
    key: str | None = option(None, "the run key id when the method has several")
    # each agent's LLM
    device: str | None = option(None, "default: the device kind the feature sets recorded")
    other_identity: bool = option(
        False, "serve even where the recorded identity cannot be reproduced (labelled)"
    )
    ray_address: str | None = option(
        None, "each model on a Ray worker: a cluster address (auto, ray://...) or 'local'", metavar="ADDRESS"
    )
    # the ledger and the HTTP server
    db: str = option("serve.db", "the ledger: SQLite file or SQLAlchemy URL")
    host: str = option("127.0.0.1", "interface to listen on")
    port: int = option(8766, "TCP port")
    learn: bool = option(False, "each head takes walla train's step on its own payouts")
    open_access: bool = option(False, "forecasts need no token (a local server)", flag="--open")
    operator_token_file: Path | None = option(
        None, "file holding the operator token (or $WALLA_MARKET_OPERATOR_TOKEN)", metavar="FILE"
    )
    key_file: Path | None = option(
        None, "the market's key: signs every event written (or $WALLA_MARKET_KEY)", metavar="FILE"
    )
    unsigned: bool = option(False, "serve without a key: the ledger's events are not signed")
    head_file: Path | None = option(None, "append the chain's signed head to this file", metavar="FILE")
    head_every: float = option(60.0, "seconds between two heads written to --head-file")
    # dynamic batching (serve/batcher.py)
    max_wait_ms: float = option(10.0, "how long a pass waits for more requests")
    max_batch: int = option(64, "prompts per scoring pass")
    max_queue: int = option(256, "waiting requests per model before 429")
    max_prompt_tokens: int = option(2048, "a prompt's tokens (its model's tokenizer) before 413")
    pass_tokens: int = option(4096, "prompt tokens per pass of short requests")
    long_tokens: int = option(512, "requests of more prompt tokens are scored alone, in pieces")
    piece_tokens: int = option(128, "prompt tokens of each piece of a long request")
    queue_deadline_s: float = option(60.0, "seconds a request may wait in the queue before 503")
    # served = offline (serve/check.py)
    check: bool = option(False, "compare served with walla train's pool; no server")
    limit: int | None = option(None, "with --check: the first N test questions")

    def __post_init__(self) -> None:
        problems = []
        if not 1 <= self.port <= 65535:
            problems.append(f"--port: expected 1..65535, got {self.port}")
        if not self.max_wait_ms >= 0:  # NaN too
            problems.append(f"--max-wait-ms must be >= 0, got {self.max_wait_ms:g}")
        if self.max_batch < 1:
            problems.append(f"--max-batch must be >= 1, got {self.max_batch}")
        if self.max_queue < 1:
            problems.append(f"--max-queue must be >= 1, got {self.max_queue}")
        for name in ("max_prompt_tokens", "pass_tokens", "long_tokens", "piece_tokens"):
            if getattr(self, name) < 1:
                problems.append(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if not self.queue_deadline_s > 0:  # NaN too
            problems.append(f"--queue-deadline-s must be > 0, got {self.queue_deadline_s:g}")
        if self.limit is not None and self.limit < 1:
            problems.append(f"--limit must be >= 1, got {self.limit}")
        if self.limit is not None and not self.check:
            problems.append("--limit goes with --check")
        if problems:
            raise ValueError("; ".join(problems))

    def batching(self) -> dict[str, float | int]:
        """The Forecaster's batching settings (serve/forecast.py, serve/batcher.py): seconds, prompts, requests,
        tokens."""
        return {
            "max_wait": self.max_wait_ms / 1000,
            "max_rows": self.max_batch,
            "max_queue": self.max_queue,
            "max_prompt_tokens": self.max_prompt_tokens,
            "pass_tokens": self.pass_tokens,
            "long_tokens": self.long_tokens,
            "piece_tokens": self.piece_tokens,
            "deadline": self.queue_deadline_s,
        }
