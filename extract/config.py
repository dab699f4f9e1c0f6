"""ExtractConfig: every setting of one `walla extract` run, validated in one place.

    cfg = build(ExtractConfig, {"model": "smollm2-135m", "dataset": "facts"}, where="command line")

Declared with the project's one config validator (walla.manifests.validate), as every stage's config is:
types are checked (and unknown keys refused) by `build`, ranges and choices by `__post_init__`, whose
problems are all reported together on one line. A backend's own settings are not fields here: they are
`backend_args` (`--backend-arg key=value`), checked against the chosen kind's `Options` when the run settles
it (extract/backends/registry.py). Importing this module imports no torch (the CLI parses with it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import field_validator
from walla.extract.backends.registry import DEFAULT_BACKEND, backend_names
from walla.manifests.validate import config, option
from walla.store.schema import VARIANTS

DTYPES = ("auto", "bfloat16", "float32", "float16")


@config
class ExtractConfig:
    model: str = option(
        help="a models.yaml name (walla ls models), hf:ORG/NAME[@REV], a local model directory or a .gguf file"
    )
    dataset: str = option(help="a datasets.yaml name (walla ls datasets)")
    variants: tuple[str, ...] | None = option(
        None, "comma list of none,relevant,irrelevant (default: every variant the dataset has)", metavar="V,V"
    )
    backend: str | None = option(
        None,
        f"{' | '.join(backend_names())} (default: the model's manifest hint; {DEFAULT_BACKEND} where it "
        "cannot run; walla ls backends)",
    )
    # the backend's own options (its kind's Options: hf compile, batch_invariant; vllm max_model_len, ...),
    # over the model's manifest backend_args
    backend_args: dict[str, str | int | float | bool] = option(
        help="key=value: one of the chosen backend's own options (its kind's Options), repeatable; e.g. "
        "compile=on (docs/pipeline.md lists each backend's)",
        flag="--backend-arg",
        metavar="KEY=VALUE",
        default_factory=dict,
    )
    data_file: Path | None = option(None, "local copy of the dataset instead of the hub")
    split: str | None = option(None, "SOURCE split to read (e.g. test for cais/mmlu)")
    hub_config: str | None = option(None, "hub config name (e.g. anatomy for cais/mmlu)")
    limit: int | None = option(
        None, "keep the first N questions (after split assignment): a different question table"
    )
    sample: int | None = option(
        None,
        "keep N questions drawn at random (seeded by the split protocol's seed; file order kept) after split "
        "assignment: a subset that spans the whole file, unlike --limit",
    )
    size: int | None = option(None, "rows of a generated dataset (bayesx, facts; overrides generator.n)")
    store: Path | str = option(
        Path("walla-store"), "feature store directory, or an fsspec URL (s3://bucket/prefix, file:///dir)"
    )
    # None (auto): 8192 / 256 on a CPU, from the free device memory and the model's shape on CUDA (sizing.py)
    batch_tokens: int | None = option(
        None,
        "padded tokens per forward pass: auto (8192 on CPU; CUDA: from free memory and model shape) | N",
        metavar="auto|N",
        cli_type=str,
    )
    shard_rows: int | None = option(
        None,
        "rows per scoring call and durable store shard (the resume granularity): auto (256 CPU, 8192 CUDA) | N",
        metavar="auto|N",
        cli_type=str,
    )
    dtype: str | None = option(None, "auto | float32 | bfloat16 | float16 (default: the model's manifest)")
    chat_template: bool | None = option(
        None,
        "wrap prompts in the chat template (default: the model's manifest; the reference: never)",
        flag="--chat-template/--no-chat-template",
    )
    device: str | None = option(None, "cpu | cuda | cuda:N | mps (default: cuda when available, else cpu)")
    context_seed: int = option(0, "seed of the irrelevant-context derangement")
    progress: bool = option(True, "a progress bar on stderr")
    # Ray (extract/distributed.py): N actors on a local Ray, or the actors of an existing cluster
    workers: int | None = option(
        None,
        "Ray actors (one model each) over row ranges; a local Ray unless --ray-address (default: no Ray)",
    )
    ray_address: str | None = option(
        None,
        "an existing Ray cluster (auto, ray://head:10001); needs walla[ray]; workers default to its GPUs",
    )

    @field_validator("variants", mode="before")
    @classmethod
    def _variants(cls, value: Any) -> Any:
        if isinstance(value, str):  # --variants none,relevant
            return tuple(v.strip() for v in value.split(",") if v.strip())
        return value

    @field_validator("backend_args", mode="before")
    @classmethod
    def _backend_args(cls, value: Any) -> Any:
        if isinstance(value, (list, tuple)):  # --backend-arg k=v (repeatable)
            return parse_backend_args(list(value))
        return value

    @field_validator("batch_tokens", "shard_rows", mode="before")
    @classmethod
    def _auto(cls, value: Any) -> Any:
        return None if value == "auto" else value

    def __post_init__(self) -> None:
        problems = []
        if self.variants is not None:
            bad = [v for v in self.variants if v not in VARIANTS]
            if bad or not self.variants:
                problems.append(
                    f"variants must be a non-empty subset of {VARIANTS}, got {list(self.variants)}"
                )
        if self.backend is not None and self.backend not in backend_names():
            problems.append(f"backend must be one of {tuple(backend_names())}, got {self.backend!r}")
        if self.dtype is not None and self.dtype not in DTYPES:
            problems.append(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        for name in (
            "limit",
            "sample",
            "size",
            "batch_tokens",
            "shard_rows",
            "workers",
        ):
            v = getattr(self, name)
            if v is not None and v < 1:
                problems.append(f"{name} must be >= 1, got {v}")
        if problems:
            raise ValueError("; ".join(problems))


def parse_backend_args(pairs: list[str] | None) -> dict[str, str]:
    """`--backend-arg key=value` (repeatable) -> {key: value}; the chosen kind's Options check the values.

    Raises:
        ValueError: an argument without `=`, or a key given twice.
    """
    out: dict[str, str] = {}
    for pair in pairs or []:
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"--backend-arg must be key=value, got {pair!r}")
        if key.strip() in out:
            raise ValueError(f"--backend-arg {key.strip()} is given twice")
        out[key.strip()] = value.strip()
    return out
