"""How walla answers its users' mistakes: exit codes, first lines and wall times of 24 wrong command lines,
plus the size of the command-line layer (issue 39).

    .venv/bin/python benchmarks/cli_mistakes.py                 # everything: sizes, then the mistakes table
    .venv/bin/python benchmarks/cli_mistakes.py --only sizes    # the static counts alone (no command runs)
    .venv/bin/python benchmarks/cli_mistakes.py --root OLD --walla OLD/.venv/bin/walla   # another checkout

Each mistake runs as `walla ...` in a fresh interpreter (what a user's shell starts), in an empty temporary
directory (so nothing lands in the repository), offline (HF_HUB_OFFLINE=1), one after the other. The
table: the exit code, the wall time and the first line on stderr. The static counts: lines per stage
(`wc -l` of its .py files), modules of 400 lines or more, imports inside functions (an AST scan of the
production code, `if TYPE_CHECKING:` blocks not counted), user-facing strings naming the old `walla-*`
scripts or `make extract` (string constants that are not docstrings), and README.md's lines.
Last line: RESULT config_errors_max_s=<the slowest of the five config mistakes> ...
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # --root: another checkout (its own `walla` with --walla)
STAGES = ("extract", "store", "train", "evaluate", "manifests", "cli", "market")
WALLA = str(Path(sys.executable).parent / "walla")
OLD_NAMES = re.compile(
    r"walla-(extract|train|eval|market|check)\b(?![.-])|walla-store(:| ls| verify| rm)|make extract"
)

# (the five config mistakes of issue 39 are marked *), then mistakes across every stage
MISTAKES: list[tuple[str, str]] = [
    ("*", "train --scenario hetero --seeds 0"),
    ("*", "train --scenario hetero --logger mlflow"),
    ("*", "extract --model nope --dataset facts"),
    ("*", "eval --report t.md --runs /nonexistent"),
    ("*", "train --scenario hetro"),
    ("", "train --scenario hetero --set bad"),
    ("", "train --scenario hetero --device cuda"),
    ("", "train --scenario demo-hetero-facts --store /nonexistent"),
    ("", "extract --model smollm2-135m --dataset nope"),
    ("", "extract --model smollm2-135m --dataset facts --backend nope"),
    ("", "extract --model smollm2-135m --dataset facts --batch-tokens abc"),
    ("", "extract --model smollm2-135m --dataset facts --device cuda --size 20"),
    ("", "eval --report t.txt"),
    ("", "eval --report t.md --scenario nope"),
    ("", "store rm ab"),
    ("", "store verify --store /nonexistent"),
    ("", "check --model nope --dataset facts"),
    ("", "market serve --port 70000 --db m.db"),
    ("", "market add-agent bad/name --db m.db"),
    ("", "market audit --db /nonexistent.db"),
    ("", "serve --scenario toy --max-batch 0"),
    ("", "serve --scenario toy --port 70000"),
    ("", "serve --scenario tyo"),
    ("", "serve --scenario toy --runs /nonexistent"),
]


def _is_docstring(node: ast.AST, parents: dict) -> bool:
    parent = parents.get(node)
    if not isinstance(parent, ast.Expr):
        return False
    holder = parents.get(parent)
    body = getattr(holder, "body", None)
    return bool(body) and body[0] is parent


def _production_files() -> list[Path]:
    return sorted(p for s in STAGES for p in (ROOT / s).rglob("*.py"))


def _scan(path: Path) -> tuple[int, list[str]]:
    """(imports inside functions, old-name strings) of one module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    imports, old = 0, []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            up, inside = parents.get(node), False
            while up is not None:
                if isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    inside = True
                if isinstance(up, ast.If) and "TYPE_CHECKING" in ast.unparse(up.test):
                    inside = False
                    break
                up = parents.get(up)
            imports += inside
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if OLD_NAMES.search(node.value) and not _is_docstring(node, parents):
                old.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return imports, old


def sizes() -> dict[str, float]:
    out: dict[str, float] = {}
    print("lines per stage (wc -l of its .py files):")
    for stage in STAGES:
        n = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in (ROOT / stage).rglob("*.py"))
        out[f"lines_{stage}"] = n
        print(f"  {stage:<10} {n:>6}")
    big = []
    imports: dict[str, int] = {}
    old: list[str] = []
    for path in _production_files():
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n >= 400:
            big.append((n, str(path.relative_to(ROOT))))
        k, o = _scan(path)
        if k:
            imports[str(path.relative_to(ROOT))] = k
        old += o
    print(f"modules >= 400 lines: {len(big)}")
    for n, p in sorted(big, reverse=True):
        print(f"  {n:>5} {p}")
    cli = {p: k for p, k in imports.items() if p.startswith("cli/") or re.search(r"/cli[^/]*\.py$", p)}
    print(f"imports inside functions: {sum(imports.values())} in {len(imports)} modules; CLI layer {cli}")
    print(f"user-facing strings naming walla-* scripts or `make extract`: {len(old)}")
    for o in old:
        print(f"  {o}")
    readme = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    print(f"README.md lines: {readme}")
    out.update(
        modules_400=len(big),
        function_imports=sum(imports.values()),
        function_imports_cli=sum(cli.values()),
        old_names=len(old),
        readme_lines=readme,
    )
    return out


def mistakes() -> dict[str, float]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200", "CUDA_VISIBLE_DEVICES": ""}
    rows, config_times = [], []
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "walla-store").mkdir()
        (Path(tmp) / "runs" / "toy").mkdir(parents=True)  # one trained-looking scenario (eval --scenario)
        (Path(tmp) / "runs" / "toy" / "scenario.json").write_text('{"name": "toy", "spec": {}}')
        floor = []  # `walla --version`: what any walla command costs on this machine now (interpreter, typer)
        for _ in range(3):
            t0 = time.perf_counter()
            subprocess.run([WALLA, "--version"], cwd=tmp, env=env, capture_output=True, timeout=300)
            floor.append(time.perf_counter() - t0)
        print(f"floor: walla --version {min(floor):.2f}s (best of 3)", flush=True)
        for mark, line in MISTAKES:
            t0 = time.perf_counter()
            proc = subprocess.run(
                [WALLA, *line.split()], cwd=tmp, env=env, capture_output=True, text=True, timeout=300
            )
            dt = time.perf_counter() - t0
            first = next((s for s in proc.stderr.splitlines() if s.strip()), "")
            rows.append((mark, line, proc.returncode, dt, first))
            if mark:
                config_times.append(dt)
            print(
                f"{mark:1} {proc.returncode:>3} {dt:6.2f}s  walla {line}\n        {first[:160]}", flush=True
            )
        left = sorted(p.name for p in Path(tmp).iterdir() if p.name not in ("walla-store", "runs", "m.db"))
    prefixes = sorted({re.sub(r"^((?:walla[ -]?\w*(?: \w[\w-]*)?: )?error:).*", r"\1", r[4]) for r in rows})
    print(f"error prefixes: {prefixes}")
    print(f"left in the working directory: {left}")
    return {
        "floor_s": min(floor),
        "config_errors_max_s": max(config_times, default=0.0),
        "mistakes_s": sum(r[3] for r in rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], usage=argparse.SUPPRESS
    )  # a mistake: one line
    parser.add_argument("--only", choices=("sizes", "mistakes"), default=None)
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose sources are counted")
    parser.add_argument("--walla", default=WALLA, help="the walla command the mistakes run")
    parser.add_argument("--match", default="", help="run only the mistakes containing this text")
    args = parser.parse_args()
    globals().update(ROOT=args.root.resolve(), WALLA=args.walla)
    MISTAKES[:] = [m for m in MISTAKES if args.match in m[1]]
    result: dict[str, float] = {}
    if args.only != "mistakes":
        result |= sizes()
    if args.only != "sizes":
        result |= mistakes()
    print(
        "RESULT "
        + " ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in result.items())
    )


if __name__ == "__main__":
    main()
