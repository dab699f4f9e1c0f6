"""`walla study`: the paper's heterogeneous claim measured on real questions with four embedded LLM families
(what `make study` runs).

    walla study [--out study-out] [--arc F] [--mmlu DIR] [--medmcqa F] [--pubmedqa F] [--seeds 5]
                [--arc-n N] [--mmlu-n N] [--medmcqa-n N] [--pubmedqa-n N] [--limit N] [--model M ...]

Read top to bottom. Every data file is checked first (a missing one is one line naming it). Each model then
extracts the study's questions: a seeded draw of `--<dataset>-n` questions of each file (`walla extract
--sample`, drawn before any result, the same questions for every model), no context, and PubMedQA with and
without its abstract (variants none,relevant). Then the paper's scenario kinds are trained, every method x
`--seeds` seeds with the preset `walla train` prints (the demo preset: every agent is an embedded model):

    hetero-mmlu-study                    heterogeneous, no context, MMLU's 10 study subjects
    hetero-mmlu-study-arc-challenge      trained on MMLU as above, tested on ARC-Challenge (the paper's OOD set)
    hetero-medmcqa-study                 heterogeneous, no context, MedMCQA
    hetero-context-pubmedqa-study        heterogeneous, one agent per question holds the abstract (private context)

(`*-study` datasets: the datasets' own loaders and prompts with a 6:1:3 split, manifests/datasets.yaml)

and reported by `walla eval` under `--out` (tables .md/.tex/.csv + plots), followed by the study's own
reading, `study.md` (evaluate/study_summary.py): each model's accuracy per dataset against chance, the marks
of WALLA I/II against UniformAvg, the best single model and StackedGen, the test n and the difference the
tables can detect, and each extraction's throughput (prompt tokens/s, dtype, tier). Each step is the stage's
own command in this process, so its output and exit codes are the command's; the first that fails stops.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer
from walla.cli import options
from walla.cli.lazy import run
from walla.cli.main import app as root

MODELS = ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
DATA = Path("../shared/data")
# Questions drawn per file (docs/study.md "Limits": chosen from each model's measured prompt tokens/s on this
# CPU so that the default run fits 45 minutes, before any result was seen). MMLU's draw is split 8:1:1 and its
# train rows also train the ARC scenario; ARC-Challenge's dev file is all test (the paper's OOD protocol).
LIMITS = {"mmlu-study": 50, "arc-challenge": 50, "medmcqa-study": 40, "pubmedqa-study": 10}
DATASETS = tuple(LIMITS)

app = options.app(help="walla study: four embedded LLM families on real ARC, MMLU, MedMCQA and PubMedQA")


def scenarios(models: list[str]) -> list[tuple[str, list[str]]]:
    """(scenario name, walla train arguments) of the study, in order."""
    ms = ["--models", ",".join(models)]
    return [
        ("hetero-mmlu-study", ["--scenario", "hetero", "--dataset", "mmlu-study", *ms]),
        (
            "hetero-mmlu-study-arc-challenge",
            ["--scenario", "hetero", "--dataset", "mmlu-study", "--eval-dataset", "arc-challenge", *ms],
        ),
        ("hetero-medmcqa-study", ["--scenario", "hetero", "--dataset", "medmcqa-study", *ms]),
        (
            "hetero-context-pubmedqa-study",
            ["--scenario", "hetero-context", "--dataset", "pubmedqa-study", *ms],
        ),
    ]


def steps(
    out: Path, files: dict[str, Path], counts: dict[str, int], seeds: int, models: list[str]
) -> list[list[str]]:
    """The study's `walla` command lines, in order."""
    store, runs = str(out / "store"), str(out / "runs")
    extract = []
    for m in models:
        for ds in DATASETS:
            variants = "none,relevant" if ds == "pubmedqa-study" else "none"
            extract.append(
                ["extract", "--model", m, "--dataset", ds, "--data-file", str(files[ds])]
                + ["--sample", str(counts[ds]), "--variants", variants, "--store", store]
            )
    train = [
        ["train", *args, "--store", store, "--runs", runs, "--seeds", str(seeds)]
        for _, args in scenarios(models)
    ]
    return [*extract, *train, ["eval", "--report", str(out / "tables.md"), "--runs", runs]]


def check_files(files: dict[str, Path]) -> str | None:
    """The first missing data file, as one line; None when all are there."""
    for ds, path in files.items():
        if not path.exists():
            flag = ds.split("-")[0]
            return f"walla study: {ds} data {path} not found (pass --{flag} FILE, or REAL_DATA=... to make study)"
    return None


@app.command()
def study(
    out: Path = typer.Option(
        Path("study-out"), "--out", help="where the store, runs, tables.md and study.md go"
    ),
    arc: Path = typer.Option(DATA / "arc" / "ARC-Challenge-Dev.jsonl", "--arc", help="ARC-Challenge jsonl"),
    mmlu: Path = typer.Option(DATA / "mmlu" / "study", "--mmlu", help="MMLU CSV file or folder of them"),
    medmcqa: Path = typer.Option(
        DATA / "medmcqa" / "dev-sample-300.jsonl", "--medmcqa", help="MedMCQA jsonl"
    ),
    pubmedqa: Path = typer.Option(
        DATA / "pubmedqa" / "ori_pqal.json", "--pubmedqa", help="PubMedQA ori_pqal.json"
    ),
    arc_n: int = typer.Option(
        LIMITS["arc-challenge"], "--arc-n", help="ARC-Challenge questions drawn (all test)"
    ),
    mmlu_n: int = typer.Option(LIMITS["mmlu-study"], "--mmlu-n", help="MMLU questions drawn (6:1:3)"),
    medmcqa_n: int = typer.Option(
        LIMITS["medmcqa-study"], "--medmcqa-n", help="MedMCQA questions drawn (6:1:3)"
    ),
    pubmedqa_n: int = typer.Option(
        LIMITS["pubmedqa-study"],
        "--pubmedqa-n",
        help="PubMedQA questions drawn (yes/no balanced first, 6:1:3)",
    ),
    limit: int | None = typer.Option(None, "--limit", help="cap every draw at N questions (quick tries)"),
    seeds: int = typer.Option(5, "--seeds", help="seeds per method"),
    models: list[str] = typer.Option(list(MODELS), "--model", help="models to extract (>= 2)"),
) -> None:
    """Four embedded LLM families on real ARC, MMLU, MedMCQA and PubMedQA: extract, train, report."""
    start = time.monotonic()
    files = {"mmlu-study": mmlu, "arc-challenge": arc, "medmcqa-study": medmcqa, "pubmedqa-study": pubmedqa}
    missing = check_files(files)
    if missing:
        typer.echo(missing, err=True)
        raise typer.Exit(2)
    counts = {
        "mmlu-study": mmlu_n,
        "arc-challenge": arc_n,
        "medmcqa-study": medmcqa_n,
        "pubmedqa-study": pubmedqa_n,
    }
    if limit is not None:
        counts = {k: min(v, limit) for k, v in counts.items()}
    typer.echo(
        "walla study: questions drawn per file: "
        + ", ".join(f"{k} {v}" for k, v in counts.items())
        + f"; models: {', '.join(models)}; {seeds} seeds"
    )
    marks = {"start": start}
    *commands, report = steps(out, files, counts, seeds, models)
    for argv in commands:
        if argv[0] == "train" and "extracted" not in marks:
            marks["extracted"] = time.monotonic()
        code = run(root, argv, "walla")
        if code != 0:
            raise typer.Exit(code)
    # `walla eval` itself (evaluate/report.py), in this process: its tables feed study.md
    from walla.evaluate import report as eval_report
    from walla.evaluate.config import EvalConfig
    from walla.evaluate.study_summary import write_summary

    typer.echo("walla study: " + " ".join(["walla", *report]))
    result = eval_report.run(EvalConfig(report=out / "tables.md", runs=out / "runs"))
    for problem in result.problems:
        typer.echo(f"walla eval: {problem.line()}", err=True)
    marks["done"] = time.monotonic()
    summary, printed = write_summary(out, [name for name, _ in scenarios(models)], models, marks, result)
    typer.echo(printed)
    typer.echo(f"walla study: done in {int(marks['done'] - start)} s -> {out / 'tables.md'}, {summary}")
