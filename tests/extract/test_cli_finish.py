"""How `walla extract` ends (cli/finish.py): a successful run freezes its objects so the teardown skips the
collector, and still joins its threads, runs every exit handler and flushes its output; its last lines say
where the time went and where the set is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tiny_model import save_tiny_checkpoint
from walla.store.features import read_feature_set

CHILD = r"""
import atexit, gc, json, sys, threading, time
handler_file, how, argv = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
# a library's exit handler, e.g. a lock release; it also records whether the teardown skips the collector
atexit.register(lambda: open(handler_file, "w").write(f"ran frozen={gc.get_freeze_count() > 0}"))
# a worker thread still busy when the command returns: joined before the process ends, as at a normal exit
threading.Thread(target=lambda: (time.sleep(2), open(handler_file + ".thread", "w").write("done"))).start()
sys.argv = ["walla-extract", *argv]
if how == "alias":
    from walla.cli.main import walla_extract
    walla_extract()
else:  # python -m walla.extract.cli
    from walla.extract.cli import main
    main()
"""


def _extract(tmp_path: Path, how: str, argv: list[str]) -> tuple[subprocess.CompletedProcess, Path]:
    handler = tmp_path / f"handler-{how}-{len(argv)}.txt"
    env = {**os.environ, "WALLA_CACHE": str(tmp_path / "cache"), "COLUMNS": "200"}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(handler), how, json.dumps(argv)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    return proc, handler


def test_a_successful_extraction_runs_exit_handlers_and_ends_with_its_timeline_and_path(tmp_path):
    model = save_tiny_checkpoint(tmp_path / "tiny")
    for how in ("alias", "module"):
        argv = ["--model", str(model), "--dataset", "facts", "--size", "12", "--store", str(tmp_path / how)]
        proc, handler = _extract(tmp_path, how, [*argv, "--device", "cpu", "--no-progress"])
        assert proc.returncode == 0, proc.stderr
        assert handler.read_text() == "ran frozen=True"  # exit handlers ran, after the objects were frozen
        assert Path(f"{handler}.thread").read_text() == "done"  # and other threads were joined
        path = Path(proc.stdout.strip().splitlines()[-1].strip())  # stdout flushed; the set's path last
        assert len(read_feature_set(path).rows) > 0
        (done,) = [x for x in proc.stderr.splitlines() if x.startswith("walla extract: done in ")]
        phases = dict(p.rsplit(" ", 2)[:2] for p in done.split(": ", 2)[2].split(", "))
        assert list(phases) == ["start-up", "inputs", "settle", "model load", "extraction", "other"], done
        total = float(done.split("done in ")[1].split(" s")[0])
        assert abs(sum(float(v) for v in phases.values()) - total) <= 0.1 * len(phases), done


def test_a_failing_extraction_exits_as_before(tmp_path):
    proc, handler = _extract(tmp_path, "alias", ["--model", "no-such-model", "--dataset", "facts"])
    assert proc.returncode == 2 and "no-such-model" in proc.stderr
    assert handler.read_text() == "ran frozen=False" and "walla extract: done" not in proc.stderr
