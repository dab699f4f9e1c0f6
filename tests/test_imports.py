"""Every module of the distribution imports on its own, in a fresh interpreter, in any order.

An import cycle between two modules (a.py imports b.py, which imports a.py) only shows when one of them
is imported first; hiding it behind an import inside a function body only moves the failure to run time.
This test imports each module alone: one fresh interpreter preloads the third-party libraries (speed
only: torch, transformers, ... take seconds to import and cannot take part in a walla cycle), then
forks one child per walla module, in a shuffled order; a child imports nothing of walla before its
module, so it sees exactly what `python -c "import walla.x.y"` sees.
A circle closed inside a function body imports fine this way, so a static test reads every module's imports
(module level and function bodies, `if TYPE_CHECKING:` left out) and finds none.
"""

from __future__ import annotations

import ast
import graphlib
import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGES = (
    "walla.cli",
    "walla.extract",
    "walla.store",
    "walla.train",
    "walla.evaluate",
    "walla.manifests",
    "walla.market",
    "walla.serve",
)
PRELOAD = (  # third-party only: a walla module here would hide the cycles this test looks for
    "torch",
    "transformers",
    "numpy",
    "polars",
    "pyarrow",
    "zarr",
    "lightning_fabric",
    "matplotlib.pyplot",
    "scipy.stats",
    "sklearn.metrics",
    "pydantic.dataclasses",
    "typer",
    "yaml",
    "datasets",
    "rich",
    "fastapi",
    "uvicorn",
    "sqlalchemy",
    "httpx",
    # the heavy submodules those import lazily (each walla module of the hf path would pay ~1 s for them)
    "transformers.modeling_utils",
    "transformers.models.auto.modeling_auto",
    "accelerate",
    "boto3",
    "gguf",
    "tokenizers",
    "huggingface_hub",
    "safetensors.torch",
    "PIL.Image",
    "sqlite3",
    "pydantic.v1",
    "uvicorn.protocols.http.h11_impl",
    "matplotlib.backends.backend_agg",
)

CHILD = r"""
import importlib, json, os, sys, traceback
for lib in PRELOAD:
    try:
        importlib.import_module(lib)
    except ImportError:
        pass
assert not [m for m in sys.modules if m.startswith("walla")], "preloading imported walla"
def start(name):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: import one module, report the end of its traceback on failure
        os.close(r)
        try:
            importlib.import_module(name)
            code = 0
        except BaseException:
            os.write(w, traceback.format_exc()[-8000:].encode())  # fits a pipe's buffer: never blocks
            code = 1
        os.close(w)
        os._exit(code)
    os.close(w)
    return pid, (name, r)


failures, running, todo = {}, {}, list(MODULES)
while todo or running:
    while todo and len(running) < PARALLEL:
        pid, job = start(todo.pop())
        running[pid] = job
    pid, status = os.waitpid(-1, 0)
    name, r = running.pop(pid)
    with os.fdopen(r, "rb") as f:
        err = f.read().decode()
    if status:
        failures[name] = err or f"exit status {status}"
print(json.dumps(failures))
"""


def module_files() -> dict[str, Path]:
    """Every .py file of the stages above by dotted name, subpackages (folders with __init__.py) included."""
    files = {}
    for stage in STAGES:
        folder = Path(importlib.util.find_spec(stage).submodule_search_locations[0])
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if not all((folder.joinpath(*parts[:i]) / "__init__.py").is_file() for i in range(len(parts))):
                continue  # a script in a data folder, not a module of the package
            files[".".join((stage, *parts)).removesuffix(".__init__")] = path
    return files


def distribution_modules() -> list[str]:
    return list(module_files())


def runtime_imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The walla modules `name` imports when it runs: at module level and inside functions alike, the
    `if TYPE_CHECKING:` blocks left out (annotations only); `from pkg import mod` counts as importing mod."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            subs = {f"{base}.{a.name}" for a in node.names} & known
            out.update(subs or {base})
    return (out & known) - {name}


def import_circle(graph: dict[str, set[str]]) -> list[str]:
    """One circle of modules that import each other, first module repeated last ([] when there is none)."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as err:
        return err.args[1]
    return []


def test_no_modules_import_each_other_even_inside_functions():
    """The fresh-interpreter test below sees a circle only when it is at module level; one closed inside a
    function body still ties the two modules together (neither can be read, moved or tested alone)."""
    files = module_files()
    graph = {name: runtime_imports(name, path, set(files)) for name, path in files.items()}
    assert graph["walla.extract.models._resolve"], "the graph found no imports"
    circle = import_circle(graph)
    assert not circle, "modules that import each other (in functions too): " + " -> ".join(circle)


def test_the_circle_finder_finds_a_circle_closed_inside_a_function(tmp_path):
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from c import x\n")
    (tmp_path / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\ndef g():\n    import a\n"
    )
    (tmp_path / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\n")
    known = {"a", "b", "c", "d"}
    graph = {n: runtime_imports(n, tmp_path / f"{n}.py", known) for n in known}
    assert graph["d"] == set() and graph["b"] == {"c"}
    circle = import_circle(graph)
    assert circle[0] == circle[-1] and sorted(circle[:-1]) == ["a", "b", "c"]


def test_the_module_list_covers_every_stage():
    names = distribution_modules()
    assert len(names) == len(set(names)) > 50
    for stage in STAGES:
        assert f"{stage}" in names or any(n.startswith(stage + ".") for n in names), stage
    assert "walla.extract.backends.hf._backend" in names and "walla.train.methods.walla" in names
    assert "walla.market.cli" in names and "walla.market.api._server" in names


def test_every_module_imports_alone_in_a_fresh_interpreter():
    names = distribution_modules()
    random.Random(0).shuffle(names)  # any order: each child starts from the same walla-free state
    parallel = max(2, os.cpu_count() or 1)
    code = f"PRELOAD = {list(PRELOAD)!r}\nMODULES = {names!r}\nPARALLEL = {parallel}\n" + CHILD
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    failures = json.loads(proc.stdout.strip().splitlines()[-1])
    report = "\n".join(
        f"--- {name}\n{err.strip().splitlines()[-1]}" for name, err in sorted(failures.items())
    )
    bad = sorted(failures)
    assert not bad, f"{len(bad)} of {len(names)} modules do not import alone:\n{report}"
