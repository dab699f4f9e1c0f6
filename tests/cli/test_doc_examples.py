"""Every `walla ...` command line shown in README.md, docs/ and manifests/ names real subcommands and options.

Examples are read from fenced code blocks (a line starting with `walla `, `$ walla ` or an old script name
such as `walla-train `, with `\\` continuations) and from inline code spans that start the same way. Each
is resolved through the root command as click would (subcommand names, then every `--option` checked
against that command's own options); `[...]`, `|`, `...` and `<placeholders>` are notation, not input.
The examples use the root (`walla train`, not `walla-train`): the old names are aliases (tests/cli).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer
from walla.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "manifests" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# a command line; not a line of output (`walla demo: done in 534 s`)
START = re.compile(r"^(\$ )?walla(-(extract|store|train|eval|market))?( (?![\w-]+:)|$)")
OLD = re.compile(r"^(\$ )?walla-(extract|store|train|eval|market)\b")


def examples(path: Path) -> list[tuple[int, str]]:
    """(line number, command line) of every walla example in a Markdown file."""
    out, fenced, pending = [], False, None
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced, pending = not fenced, None
            continue
        if fenced:
            text = line.strip()
            if pending is not None:
                pending = (pending[0], pending[1] + " " + text.rstrip("\\"))
            elif START.match(text):
                pending = (n, text.rstrip("\\"))
            if pending is not None and not text.endswith("\\"):
                out.append(pending)
                pending = None
        else:
            out += [(n, span) for span in re.findall(r"`([^`]+)`", line) if START.match(span) and " " in span]
    return out


def _words(example: str) -> list[str]:
    text = re.sub(r"\s#.*$", "", example).removeprefix("$ ")
    text = text.replace("[", " ").replace("]", " ").replace("|", " ")
    words = shlex.split(text)
    name = words.pop(0)
    return ([name.removeprefix("walla-")] if name != "walla" else []) + words


def check(example: str) -> str | None:
    """None when the example parses; else what is wrong with it."""
    cmd = typer.main.get_command(app)
    ctx = cmd.make_context("walla", ["--help"], resilient_parsing=True)
    path = ["walla"]
    words = [w for w in _words(example) if w != "..." and not w.startswith("<")]
    while hasattr(cmd, "get_command"):
        names = [w for w in words if not w.startswith("-")]
        if not names:  # a group alone (`walla market`, `walla --version`): its own options
            break
        sub = cmd.get_command(ctx, names[0])
        if sub is None:
            return f"{' '.join(path)}: no subcommand {names[0]!r}"
        words.remove(names[0])
        cmd, path = sub, [*path, names[0]]
        ctx = cmd.make_context(names[0], ["--help"], parent=ctx, resilient_parsing=True)
    known = {"--help"} | {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
    bad = [w.split("=")[0] for w in words if w.startswith("--") and w.split("=")[0] not in known]
    return f"{' '.join(path)}: no option {', '.join(bad)}" if bad else None


def all_examples() -> list[tuple[str, str]]:
    return [(f"{p.relative_to(ROOT)}:{n}", ex) for p in DOCS for n, ex in examples(p)]


def test_the_docs_have_examples_of_every_stage():
    subs = {(_words(ex) or [""])[0] for _, ex in all_examples()}
    assert {"extract", "store", "train", "eval", "check", "market", "demo"} <= subs, subs


@pytest.mark.parametrize(("where", "example"), all_examples(), ids=lambda x: x if ":" in x else None)
def test_every_example_parses(where, example):
    assert check(example) is None, f"{where}: {example}: {check(example)}"
    assert not OLD.match(example), f"{where}: use the root, `walla {OLD.match(example).group(2)} ...`"
