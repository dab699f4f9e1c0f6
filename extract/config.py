"""ExtractConfig: every setting of one `walla-extract` run, validated in one place.

    cfg = build(ExtractConfig, {"model": "smollm2-135m", "dataset": "facts"}, where="command line")

Declared with the project's one config validator (walla.manifests.validate), as every stage's config is:
types are checked (and unknown keys refused) by `build`, ranges and choices by `__post_init__`, whose
problems are all reported together on one line. A backend's own settings are not fields here: they are
`backend_args` (`--backend-arg key=value`), checked against the chosen kind's `Options` when the run settles
it (extract/backends/registry.py). Importing this module imports no torch (the CLI parses with it).
"""

from __future__ import annotations

from dataclasses import field
from pathlib import Path

from walla.extract.backends.registry import backend_names
from walla.manifests.validate import config
from walla.store.schema import VARIANTS

DTYPES = ("auto", "bfloat16", "float32", "float16")


@config
class ExtractConfig:
    model: str  # models.yaml key
    dataset: str  # datasets.yaml key
    variants: tuple[str, ...] | None = None  # None: every variant the dataset supports
    backend: str | None = None  # a registered backend (extract/backends/registry.py); None: the manifest hint
    # the backend's own options (its kind's Options: hf compile, batch_invariant; vllm max_model_len, ...),
    # over the model's manifest backend_args
    backend_args: dict[str, str | int | float | bool] = field(default_factory=dict)

    data_file: Path | None = None  # local copy instead of the hub
    split: str | None = None  # SOURCE split to read (hub split name, e.g. "test" for cais/mmlu)
    hub_config: str | None = None  # hub config name override (e.g. "anatomy" for cais/mmlu)
    limit: int | None = (
        None  # keep the first N questions (after split assignment): a different question table
    )
    size: int | None = None  # generated datasets: number of rows (overrides generator.n)
    store: Path | str = Path("walla-store")  # a directory, or an fsspec URL (s3://bucket/prefix)
    # None (auto): 8192 / 256 on a CPU, from the free device memory and the model's shape on CUDA (sizing.py)
    batch_tokens: int | None = None  # padded tokens per forward pass (rows x longest prompt in the bucket)
    shard_rows: int | None = None  # rows per scoring call and durable store shard (the resume granularity)
    dtype: str | None = None  # None: the model's manifest dtype
    chat_template: bool | None = None  # None: the model's manifest setting (the reference: never)
    device: str | None = None  # None: cuda when available, else cpu
    context_seed: int = 0  # seeds the irrelevant-context derangement
    progress: bool = True  # rich progress bar on stderr
    # Ray (extract/distributed.py): N actors on a local Ray, or the actors of an existing cluster
    workers: int | None = None  # None: one process, no Ray
    ray_address: str | None = None  # e.g. "auto" or "ray://head:10001"; workers default to its GPUs

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
