"""`walla-extract`: run the extraction recipe (extract/run.py) for one model and one dataset.

    walla-extract --model smollm2-135m --dataset facts
    walla-extract --model smollm2-135m --dataset arc-challenge --data-file ARC-Challenge-Dev.jsonl
    walla-extract --model aloe --dataset pubmedqa --backend vllm --backend-arg max_model_len=4096

Thin: the options below are written once; their names are ExtractConfig's fields, and `to_config` turns
them into one through the one validator (walla.manifests.validate), then run() runs. Importing this module
imports no torch: the recipe is imported when the command runs. Every failure is ONE line on stderr: exit
2 for an unknown model/dataset/backend name or a bad option (a bad `--backend-arg` included), 3 when the
hub cannot serve a model or dataset, 1 for bad data or store problems, 130 when interrupted (rerun to resume).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from walla.extract.backends.registry import DEFAULT_BACKEND, backend_names

if TYPE_CHECKING:
    from walla.extract.config import ExtractConfig

app = typer.Typer(add_completion=False, help="walla extract stage: LLM features of a dataset into the store")


def _fail(msg: str, code: int) -> None:
    typer.echo(f"walla-extract: error: {msg}", err=True)
    raise typer.Exit(code)


def to_config(given: dict) -> ExtractConfig:
    """The command's options (named as ExtractConfig's fields) -> ExtractConfig, `auto` as None.

    Raises:
        ValueError (ConfigError): every bad option, one line each, naming it.
    """
    from walla.extract.config import ExtractConfig, parse_backend_args  # walla.cli.lazy: not for --help
    from walla.manifests.validate import build

    raw = dict(given)
    raw["variants"] = (
        tuple(v.strip() for v in raw["variants"].split(",") if v.strip()) if raw["variants"] else None
    )
    raw["backend_args"] = parse_backend_args(raw.pop("backend_arg"))
    for name in ("batch_tokens", "shard_rows"):  # a bad number is one ConfigError line naming the option
        raw[name] = None if raw[name] == "auto" else raw[name]
    return build(ExtractConfig, raw, where="command line")


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
        help=f"{' | '.join(backend_names())} (default: the model's manifest hint; {DEFAULT_BACKEND} where it cannot run)",
    ),
    backend_arg: list[str] = typer.Option(
        None,
        "--backend-arg",
        help="key=value: one of the chosen backend's own options (its kind's Options), repeatable; "
        "e.g. compile=on (docs/pipeline.md lists each backend's)",
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
    chat_template: bool = typer.Option(
        None, "--chat-template/--no-chat-template", help="wrap prompts in the chat template"
    ),
    device: str = typer.Option(None, help="cpu | cuda (default: cuda when available)"),
    context_seed: int = typer.Option(0, "--context-seed", help="seed of the irrelevant-context derangement"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="show a progress bar"),
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
    given = dict(locals())  # the options above, exactly: written once, named as ExtractConfig's fields
    logging.basicConfig(level=logging.WARNING, format="walla-extract: %(message)s")
    try:
        cfg = to_config(given)
    except ValueError as e:  # ConfigError: one line per problem, naming the option
        _fail(str(e), 2)
    # the recipe imports torch and transformers: only when the command runs, so parsing and --help stay fast
    from walla.extract.hub import HubUnavailableError
    from walla.extract.run import run
    from walla.extract.timeline import Timeline
    from walla.manifests.validate import ConfigError
    from walla.store.files import describe_os_error

    try:
        timeline = Timeline()  # after the imports: start-up includes them
        run(cfg, out=typer.echo, timeline=timeline)
        typer.echo(timeline.line(), err=True)  # on stderr: stdout's last line stays the feature set's path
    except KeyError as e:
        _fail(str(e.args[0] if e.args else e), 2)
    except ConfigError as e:  # a bad --backend-arg, checked against the chosen backend's options
        _fail(str(e), 2)
    except HubUnavailableError as e:
        _fail(str(e), 3)
    except OSError as e:  # the path and what was expected, in words (not "[Errno 21]")
        _fail(describe_os_error(e), 1)
    except (ValueError, RuntimeError) as e:
        _fail(" ".join(str(e).split()), 1)
    except KeyboardInterrupt:
        _fail("interrupted; rerun the same command to resume after the last durable shard", 130)


def main() -> None:
    """`python -m walla.extract.cli ...`: `walla extract ...`."""
    from walla.cli.finish import finish
    from walla.cli.lazy import run as run_command

    finish(run_command(app, sys.argv[1:], "walla-extract"), "extract")


if __name__ == "__main__":
    sys.exit(main())
