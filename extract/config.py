"""ExtractConfig: every setting of one `walla-extract` run, validated in one place.

    cfg = build(ExtractConfig, {"model": "smollm2-135m", "dataset": "facts"}, where="command line")

Declared with the project's one config validator (walla.manifests.validate), as every stage's config is:
types are checked (and unknown keys refused) by `build`, ranges and choices by `__post_init__`, whose
problems are all reported together on one line.
"""

from __future__ import annotations

from pathlib import Path

from walla.extract.backends.hf import BATCH_INVARIANT_MODES
from walla.extract.backends.hf_compile import COMPILE_MODES
from walla.extract.backends.registry import BACKEND_KINDS
from walla.manifests.validate import config
from walla.store.schema import VARIANTS

DTYPES = ("auto", "bfloat16", "float32", "float16")


@config
class ExtractConfig:
    model: str  # models.yaml key
    dataset: str  # datasets.yaml key
    variants: tuple[str, ...] | None = None  # None: every variant the dataset supports
    backend: str | None = None  # a registered backend (hf | vllm); None: the model's manifest hint

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
    compile: str = "auto"  # hf backend: torch.compile the decoder layers (auto: by device and job size)
    batch_invariant: str = "auto"  # hf backend: packed per-prompt scoring (auto: reduced precision on CPU)
    chat_template: bool | None = None  # None: the model's manifest setting (the reference: never)
    device: str | None = None  # None: cuda when available, else cpu
    context_seed: int = 0  # seeds the irrelevant-context derangement
    progress: bool = True  # rich progress bar on stderr
    # vllm backend only (None: vLLM's default; --gpu-memory-utilization is the budget of its two engines)
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    enforce_eager: bool | None = None  # None: eager on CPU, CUDA graphs on GPU
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
        if self.backend is not None and self.backend not in BACKEND_KINDS:
            problems.append(f"backend must be one of {tuple(BACKEND_KINDS)}, got {self.backend!r}")
        if self.dtype is not None and self.dtype not in DTYPES:
            problems.append(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.compile not in COMPILE_MODES:
            problems.append(f"compile must be auto, on or off, got {self.compile!r}")
        if self.batch_invariant not in BATCH_INVARIANT_MODES:
            problems.append(f"batch_invariant must be auto, on or off, got {self.batch_invariant!r}")
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            problems.append(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        for name in (
            "limit",
            "size",
            "batch_tokens",
            "shard_rows",
            "tensor_parallel_size",
            "max_model_len",
            "workers",
        ):
            v = getattr(self, name)
            if v is not None and v < 1:
                problems.append(f"{name} must be >= 1, got {v}")
        if problems:
            raise ValueError("; ".join(problems))
