"""`walla-extract`: run the extraction recipe (extract/run.py) for one model and one dataset.

    walla-extract --model smollm2-135m --dataset facts
    walla-extract --model smollm2-135m --dataset arc-challenge --data-file ARC-Challenge-Dev.jsonl
    walla-extract --model aloe --dataset pubmedqa --backend vllm --variants none,relevant

Thin: parse, build an ExtractConfig (walla.manifests.validate), call run(). Every failure is ONE line on stderr:
exit 2 for an unknown model/dataset name or bad option, 3 when the hub cannot serve a model or
dataset, 1 for bad data or store problems, 130 when interrupted (rerun to resume).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import typer

app = typer.Typer(add_completion=False, help="walla extract stage: LLM features of a dataset into the store")


def _fail(msg: str, code: int) -> None:
    typer.echo(f"walla-extract: error: {msg}", err=True)
    raise typer.Exit(code)


@app.command()
def extract(
    model: str = typer.Option(
        ..., help="model name from manifests/models.yaml (e.g. smollm2-135m, gemma3-270m)"
    ),
    dataset: str = typer.Option(..., help="dataset name from manifests/datasets.yaml"),
    variants: str = typer.Option(
        None, help="comma list of none,relevant,irrelevant (default: all the dataset has)"
    ),
    backend: str = typer.Option(
        None,
        help="hf | vllm (default: the model's manifest hint; hf where it cannot run)",  # tests/cli: registry's
    ),
    data_file: Path = typer.Option(None, "--data-file", help="local copy of the dataset instead of the hub"),
    split: str = typer.Option(None, help="source split to read (e.g. test for cais/mmlu)"),
    hub_config: str = typer.Option(None, "--hub-config", help="hub config name (e.g. anatomy for cais/mmlu)"),
    limit: int = typer.Option(None, help="keep the first N questions"),
    size: int = typer.Option(None, help="rows of a generated dataset (bayesx, facts)"),
    store: str = typer.Option(
        "walla-store", help="feature store directory, or an fsspec URL (s3://bucket/prefix, file:///dir)"
    ),
    batch_tokens: str = typer.Option(
        "auto",
        "--batch-tokens",
        help="padded tokens per forward pass: auto (8192 on CPU; CUDA: from free memory and model shape) | N",
    ),
    shard_rows: str = typer.Option(
        "auto",
        "--shard-rows",
        help="rows per scoring call and durable store shard: auto (256 CPU, 8192 CUDA) | N",
    ),
    dtype: str = typer.Option(
        None, help="auto | float32 | bfloat16 | float16 (default: the model's manifest)"
    ),
    compile: str = typer.Option(
        "auto",
        "--compile",
        help="hf: torch.compile the decoder layers: auto (by device, job size) | on | off",
    ),
    batch_invariant: str = typer.Option(
        "auto",
        "--batch-invariant",
        help="hf: packed per-prompt scoring: auto (on for bf16/fp16 on CPU; off on CUDA and in fp32) | on | off",
    ),
    chat_template: bool = typer.Option(
        None, "--chat-template/--no-chat-template", help="wrap prompts in the chat template"
    ),
    device: str = typer.Option(None, help="cpu | cuda (default: cuda when available)"),
    context_seed: int = typer.Option(0, "--context-seed", help="seed of the irrelevant-context derangement"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="show a progress bar"),
    tensor_parallel_size: int = typer.Option(1, "--tensor-parallel-size", help="vllm: GPUs per model"),
    gpu_memory_utilization: float = typer.Option(
        None, "--gpu-memory-utilization", help="vllm: memory fraction for its two engines together"
    ),
    max_model_len: int = typer.Option(
        None, "--max-model-len", help="vllm: context length (default: the model's)"
    ),
    enforce_eager: bool = typer.Option(
        None, "--enforce-eager/--no-enforce-eager", help="vllm: no CUDA graphs/compile (default: on CPU only)"
    ),
    workers: int = typer.Option(
        None,
        "--workers",
        help="Ray actors (one model each) over row ranges; a local Ray unless --ray-address",
    ),
    ray_address: str = typer.Option(
        None, "--ray-address", help="an existing Ray cluster (auto, ray://head:10001); needs walla[ray]"
    ),
) -> None:
    """Extract option log-probs, last-token hidden states and prompt NLL for every prompt variant."""
    # the config and the recipe (torch, transformers) are imported when the command runs: walla.cli.lazy
    from walla.extract.config import ExtractConfig
    from walla.extract.hub import HubUnavailableError
    from walla.extract.run import run
    from walla.manifests.validate import build
    from walla.store.files import describe_os_error

    logging.basicConfig(level=logging.WARNING, format="walla-extract: %(message)s")
    try:
        options = dict(
            model=model,
            dataset=dataset,
            backend=backend,
            data_file=data_file,
            split=split,
            hub_config=hub_config,
            variants=tuple(v.strip() for v in variants.split(",") if v.strip()) if variants else None,
            limit=limit,
            size=size,
            store=store,
            # `auto` is None; a bad value is one ConfigError line naming the option
            batch_tokens=None if batch_tokens == "auto" else batch_tokens,
            shard_rows=None if shard_rows == "auto" else shard_rows,
            dtype=dtype,
            compile=compile,
            batch_invariant=batch_invariant,
            chat_template=chat_template,
            device=device,
            context_seed=context_seed,
            progress=progress,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            enforce_eager=enforce_eager,
            workers=workers,
            ray_address=ray_address,
        )
        cfg = build(ExtractConfig, options, where="command line")
    except ValueError as e:  # ConfigError: one line per problem, naming the option
        _fail(str(e), 2)
    try:
        run(cfg, out=typer.echo)
    except KeyError as e:
        _fail(str(e.args[0] if e.args else e), 2)
    except HubUnavailableError as e:
        _fail(str(e), 3)
    except OSError as e:  # the path and what was expected, in words (not "[Errno 21]")
        _fail(describe_os_error(e), 1)
    except (ValueError, RuntimeError) as e:
        _fail(" ".join(str(e).split()), 1)
    except KeyboardInterrupt:
        _fail("interrupted; rerun the same command to resume after the last durable shard", 130)


def main() -> None:
    app(prog_name="walla-extract")


if __name__ == "__main__":
    sys.exit(main())
