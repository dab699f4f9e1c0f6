"""The `walla` root: the lists of subcommands name every command with its own help, the old script names
are its aliases, usage errors are one line with exit 2, and `walla demo` runs the Makefile's old steps."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from importlib.metadata import entry_points, version
from pathlib import Path

import pytest
import typer
import walla.market.cli
from walla.cli import demo
from walla.cli.lazy import Lazy, load, run
from walla.cli.main import COMMANDS, app
from walla.extract.backends.registry import BACKEND_KINDS
from walla.extract.cli import app as extract_app
from walla.market.cli import COMMANDS as MARKET_COMMANDS


def _first_paragraph(text: str) -> str:
    return " ".join(text.strip().split("\n\n")[0].split())


@pytest.mark.parametrize(
    ("name", "entry"), [*COMMANDS.items(), *(("market " + n, e) for n, e in MARKET_COMMANDS.items())]
)
def test_each_listed_help_line_is_the_commands_own(name: str, entry: Lazy):
    """`walla --help` lists a subcommand without importing it: its line must match the command's help."""
    assert entry.help == _first_paragraph(load(entry).help), name


def test_every_market_command_is_listed():
    """A command added to a market/cli/ module must be added to walla.market.cli.COMMANDS."""
    listed = {(e.target.split(":")[0], e.command or n) for n, e in MARKET_COMMANDS.items()}
    found = set()
    for mod in pkgutil.iter_modules(walla.market.cli.__path__):
        module = importlib.import_module(f"walla.market.cli.{mod.name}")
        if isinstance(getattr(module, "app", None), typer.Typer):
            cmd = typer.main.get_command(module.app)
            names = cmd.commands if hasattr(cmd, "commands") else [cmd.name]
            found |= {(module.__name__, n) for n in names}
    assert found and listed == found
    assert all(e.command is None or e.command == n for n, e in MARKET_COMMANDS.items())


def test_old_script_names_are_aliases_of_the_root():
    scripts = {e.name: e.value for e in entry_points(group="console_scripts") if e.name.startswith("walla")}
    assert scripts == {
        "walla": "walla.cli.main:main",
        **{
            f"walla-{n}": f"walla.cli.main:walla_{n}" for n in ("extract", "store", "train", "eval", "market")
        },
    }


def test_version_and_usage_errors(capfd):
    assert run(app, ["--version"], "walla") == 0
    assert capfd.readouterr().out.strip() == f"walla {version('walla')}"
    for argv, words in [
        (["trian"], "No such command 'trian'. Did you mean 'train'?"),
        (["train", "--bogus"], "walla train: error: No such option: --bogus"),
        (["market", "serv"], "Did you mean 'serve'?"),
        (["eval", "--report"], "--report"),
    ]:
        assert run(app, argv, "walla") == 2, argv
        err = capfd.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1, err


def test_extract_backend_help_names_every_registered_backend():
    """extract/cli.py names the backends in words (the registry imports torch); they must stay the registry's."""
    (backend,) = [p for p in typer.main.get_command(extract_app).params if p.name == "backend"]
    assert all(kind in backend.help for kind in BACKEND_KINDS if kind != "dummy"), backend.help


def test_demo_steps_are_the_makefiles_old_commands():
    """The commands the Makefile's demo target ran before `walla demo` (make demo, defaults, DEMO_STATES)."""
    out, store, runs = "demo-out", "demo-out/store", "demo-out/runs"
    old = (
        [
            f"extract --model {m} --dataset facts --size 400 --variants none,relevant --store {store}"
            for m in ("smollm2-135m", "gemma3-270m")
        ]
        + [
            f"train --scenario {s} --store {store} --runs {runs} --seeds 5" + keep
            for s, keep in (
                ("demo-homo-facts", " --save-states walla-i"),  # the heads `walla market replay` plays
                ("demo-hetero-nocontext", ""),
                ("demo-hetero-facts", " --save-states walla-i"),  # the heads `walla serve` serves
            )
        ]
        + [f"eval --report {out}/tables.md --runs {runs}"]
    )
    got = demo.steps(Path(out), 400, 5, list(demo.MODELS), list(demo.SCENARIOS))
    assert [" ".join(argv) for argv in got] == old


def test_demo_runs_every_step_and_stops_at_the_first_failure(tmp_path, monkeypatch, capfd):
    """The real stage commands on the seeded fake backend and two quick methods (the recipe is demo.steps)."""
    steps = demo.steps
    fast = ["--methods", "uniform,walla-i", "--set", "walla.epochs=1", "--set", "walla.hidden=[8]"]

    def quick(*args):
        return [
            a
            + (
                ["--backend", "dummy", "--no-progress"]
                if a[0] == "extract"
                else fast
                if a[0] == "train"
                else ["--no-plots"]
            )
            for a in steps(*args)
        ]

    monkeypatch.setattr(demo, "steps", quick)
    out = tmp_path / "d"
    argv = ["demo", "--out", str(out), "--facts", "40", "--seeds", "1", "--scenario", "demo-hetero-facts"]
    assert run(app, argv, "walla") == 0
    printed = capfd.readouterr().out
    assert "walla train: scenario demo-hetero-facts" in printed and f"wrote {out / 'tables.md'}" in printed
    assert printed.strip().splitlines()[-1].startswith("walla demo: done in ")
    assert (out / "tables.md").is_file()
    assert run(app, [*argv[:-1], "no-such-scenario"], "walla") == 2  # train's exit code; eval never ran
    captured = capfd.readouterr()
    assert "no such scenario 'no-such-scenario'" in captured.err and "walla demo: done" not in captured.out


def test_market_serve_help_states_the_servers_max_body():
    """`--max-body` defaults to the server's MAX_BODY, named in words (api/server.py imports FastAPI)."""
    pytest.importorskip(
        "fastapi", reason="the market server needs the market extra: pip install 'walla[market]'"
    )
    from walla.market.api import MAX_BODY

    serve = load(MARKET_COMMANDS["serve"])
    (opt,) = [p for p in serve.params if p.name == "max_body"]
    assert f"default: {MAX_BODY}," in opt.help


def test_a_door_loads_a_room_on_first_use_and_keeps_the_name(tmp_path, monkeypatch):
    """cli/lazy.py `door`: a name's room is imported when the name is first read, the value is the room's own,
    it is then kept in the package (a per-call `from door import name` reads it, not importlib), and a name
    no room exports is an AttributeError naming the package."""
    pkg = tmp_path / "doorpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from walla.cli.lazy import door\n__getattr__, __all__ = door(__name__, {'_room': ('VALUE',)})\n"
    )
    (pkg / "_room.py").write_text("VALUE = object()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "modules", dict(sys.modules))  # doorpkg is gone from sys.modules after the test
    door_pkg = importlib.import_module("doorpkg")
    assert "doorpkg._room" not in sys.modules and "VALUE" not in vars(door_pkg)
    value = door_pkg.VALUE
    assert value is importlib.import_module("doorpkg._room").VALUE and vars(door_pkg)["VALUE"] is value
    assert door_pkg.__all__ == ["VALUE"]
    with pytest.raises(AttributeError, match="'doorpkg' has no attribute 'OTHER'"):
        _ = door_pkg.OTHER
