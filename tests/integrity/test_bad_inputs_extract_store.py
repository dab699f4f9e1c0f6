"""Bad inputs to `walla extract` and `walla-store`, as a new user would make them (issue 12).

Every case runs the real CLI in-process (typer CliRunner) on a copy of a tiny store (generated `facts`
data, dummy backend) and asserts: exit code != 0, ONE line on stderr naming the offending file/key, no
traceback, and afterwards the store verifies -- as it is for a bad argument, or after running the fix
the message names for a damaged store (the remedy is run, not just printed).
"""

from __future__ import annotations

import json
import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import filelock
import pytest
import torch
from typer.testing import CliRunner
from walla.cli.main import app as root_app
from walla.extract.backends.dummy import DUMMY
from walla.extract.cli import app as extract_app
from walla.store.cli import app as store_app
from walla.store.features import StoreError, list_feature_sets, read_feature_set

runner = CliRunner()
BASE = ["--model", "smollm2-135m", "--backend", "dummy", "--variants", "none", "--no-progress"]


def extract(store: Path, *args: str) -> list[str]:
    return [*BASE, "--store", str(store), *args]


def invoke(cli: str, argv: list[str]):
    """`cli`: "walla" (a command line as a message writes it: `walla store rm ...`) or one stage's app."""
    if cli == "walla":
        return runner.invoke(root_app, argv)
    return runner.invoke(extract_app if cli == "walla extract" else store_app, argv)


@pytest.fixture(scope="module")
def base_store(tmp_path_factory) -> Path:
    store = tmp_path_factory.mktemp("base") / "store"
    r = invoke("walla extract", extract(store, "--dataset", "facts", "--size", "20"))
    assert r.exit_code == 0, r.output
    return store


def feature_dir(store: Path) -> Path:
    (info,) = list_feature_sets(store)
    return info.path


def question_dir(store: Path) -> Path:
    (d,) = (store / "questions" / "facts").iterdir()
    return d


def flip_byte(path: Path, at: int = 7) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def replace_with_dir(path: Path) -> None:
    path.unlink()
    path.mkdir()


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def verify_argv(store: Path, tmp: Path) -> list[str]:
    return ["verify", "--store", str(store)]


def write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


GOOD_ROW = json.dumps({"id": 1, "question": "Q?", "options": ["a", "b"], "label": 0})


@dataclass
class Case:
    name: str
    cli: str  # walla extract | walla-store
    argv: Callable[[Path, Path], list[str]]  # (store, tmp) -> argv
    names: str  # the stderr line must contain this (the offending file / key / value)
    damage: Callable[[Path], None] | None = None  # what the user did to the store first
    code: int | None = None  # exact exit code where it is part of the contract
    run_fix: bool = field(default=False)  # the message names a fix: run it, then the store must verify


def _fp(store: Path) -> str:
    return feature_dir(store).name


CASES = [
    # --- walla extract: arguments and data ----------------------------------------------------------------
    Case(  # issue 12 #3: made 2 train / 0 val / 0 test rows without a word
        "facts --size 3",
        "walla extract",
        lambda s, t: extract(s, "--dataset", "facts", "--size", "3"),
        "need >= 1 val and >= 1 test row (--size 8 is the minimum)",
    ),
    Case(  # issue 12 #5: --data-file was silently ignored
        "facts --data-file",
        "walla extract",
        lambda s, t: extract(s, "--dataset", "facts", "--size", "20", "--data-file", str(t / "x.jsonl")),
        "drop --data-file",
    ),
    Case(
        "bayesx --data-file",
        "walla extract",
        lambda s, t: extract(s, "--dataset", "bayesx", "--size", "40", "--data-file", str(t / "x.jsonl")),
        "'bayesx' is generated",
    ),
    Case(  # the hf backend (not dummy): was 146 lines of traceback
        "--device cuda without a GPU",
        "walla extract",
        lambda s, t: (
            ["--model", "smollm2-135m", "--dataset", "facts", "--size", "20", "--store", str(s)]
            + ["--variants", "none", "--no-progress", "--device", "cuda"]
        ),
        "--device cuda: no CUDA GPU is usable",
    ),
    Case(
        "--device gpu",
        "walla extract",
        lambda s, t: extract(s, "--dataset", "facts", "--size", "20", "--device", "gpu"),
        "--device must be cpu, cuda, cuda:N or mps, got 'gpu'",
    ),
    Case(
        "unknown dataset",
        "walla extract",
        lambda s, t: extract(s, "--dataset", "factz"),
        "no such dataset 'factz'; did you mean --dataset facts (a dataset)?",
        code=2,
    ),
    Case(
        "unknown model",
        "walla extract",
        lambda s, t: ["--model", "nope", "--dataset", "facts", "--store", str(s), "--backend", "dummy"],
        "no such model 'nope'",
        code=2,
    ),
    Case(
        "bad variant",
        "walla extract",
        lambda s, t: [
            "--model",
            "smollm2-135m",
            "--dataset",
            "facts",
            "--variants",
            "nonee",
            "--store",
            str(s),
        ],
        "variants must be a non-empty subset",
        code=2,
    ),
    Case(
        "--size on a loaded dataset",
        "walla extract",
        lambda s, t: extract(s, "--dataset", "jsonl", "--size", "5"),
        "--size only applies to generated datasets",
    ),
    Case(
        "--limit 0",
        "walla extract",
        lambda s, t: extract(s, "--dataset", "facts", "--limit", "0"),
        "limit must be >= 1, got 0",
        code=2,
    ),
    Case(
        "jsonl without --data-file",
        "walla extract",
        lambda s, t: extract(s, "--dataset", "jsonl"),
        "pass --data-file PATH",
    ),
    Case(
        "jsonl --data-file missing",
        "walla extract",
        lambda s, t: extract(s, "--dataset", "jsonl", "--data-file", str(t / "missing.jsonl")),
        "missing.jsonl does not exist",
    ),
    Case(
        "jsonl --data-file not JSON",
        "walla extract",
        lambda s, t: extract(
            s, "--dataset", "jsonl", "--data-file", str(write_jsonl(t / "bad.jsonl", [GOOD_ROW, "{oops"]))
        ),
        "bad.jsonl, line 2: not valid JSON",
    ),
    Case(
        "jsonl --data-file a directory",
        "walla extract",
        lambda s, t: extract(s, "--dataset", "jsonl", "--data-file", str(t)),
        "is a directory; expected a JSON / JSON lines file",
    ),
    Case(
        "jsonl --data-file not UTF-8",
        "walla extract",
        lambda s, t: extract(
            s,
            "--dataset",
            "jsonl",
            "--data-file",
            str(write_bytes(t / "latin1.jsonl", b'{"question": "caf\xe9"}')),
        ),
        "latin1.jsonl: not UTF-8 text",
    ),
    Case(
        "jsonl row without a label",
        "walla extract",
        lambda s, t: extract(
            s,
            "--dataset",
            "jsonl",
            "--data-file",
            str(
                write_jsonl(
                    t / "nolabel.jsonl",
                    [GOOD_ROW, json.dumps({"id": 2, "question": "Q", "options": ["a", "b"]})],
                )
            ),
        ),
        "nolabel.jsonl, line 2: missing field 'label'",
    ),
    Case(  # issue 12 #1 seen from extract: "already complete" must not hide a corrupt set
        "extract over a tampered chunk",
        "walla extract",
        lambda s, t: extract(s, "--dataset", "facts", "--size", "20"),
        "hidden.zarr/c/0/0 changed after it was written",
        damage=lambda s: flip_byte(feature_dir(s) / "hidden.zarr" / "c" / "0" / "0"),
        run_fix=True,
    ),
    Case(
        "extract over a corrupt questions.parquet",
        "walla extract",
        lambda s, t: extract(s, "--dataset", "facts", "--size", "20"),
        "questions.parquet",
        damage=lambda s: flip_byte(question_dir(s) / "questions.parquet", at=40),
        run_fix=True,
    ),
    # --- walla-store --------------------------------------------------------------------------------------
    Case(  # issue 12 #4: exited 0
        "verify a store that does not exist",
        "walla-store",
        lambda s, t: ["verify", "--store", str(t / "nowhere")],
        "nowhere does not exist",
        code=1,
    ),
    Case(
        "verify a store that is a file",
        "walla-store",
        lambda s, t: ["verify", "--store", str(write_jsonl(t / "a-file", ["x"]))],
        "a-file is a file, expected a store directory",
        code=1,
    ),
    Case(
        "ls a store that is a file",
        "walla-store",
        lambda s, t: ["ls", "--store", str(write_jsonl(t / "a-file", ["x"]))],
        "a-file is a file",
    ),
    Case(
        "verify: flipped byte in a hidden chunk",
        "walla-store",
        verify_argv,
        "hidden.zarr/c/0/0 changed after it was written",
        damage=lambda s: flip_byte(feature_dir(s) / "hidden.zarr" / "c" / "0" / "0"),
        code=1,
        run_fix=True,
    ),
    Case(
        "verify: deleted hidden chunk",
        "walla-store",
        verify_argv,
        "hidden.zarr/c/0/0 is missing",
        damage=lambda s: (feature_dir(s) / "hidden.zarr" / "c" / "0" / "0").unlink(),
        run_fix=True,
    ),
    Case(
        "verify: edited zarr.json",
        "walla-store",
        verify_argv,
        "hidden.zarr/zarr.json changed after it was written",
        damage=lambda s: (feature_dir(s) / "hidden.zarr" / "zarr.json").write_text("{}"),
        run_fix=True,
    ),
    Case(
        "verify: deleted feature meta.json",
        "walla-store",
        verify_argv,
        "meta.json is missing",
        damage=lambda s: (feature_dir(s) / "meta.json").unlink(),
        run_fix=True,
    ),
    Case(
        "verify: truncated rows.parquet",
        "walla-store",
        verify_argv,
        "rows.parquet",
        damage=lambda s: truncate(feature_dir(s) / "rows.parquet"),
        run_fix=True,
    ),
    Case(
        "verify: truncated questions.parquet",
        "walla-store",
        verify_argv,
        "questions.parquet",
        damage=lambda s: truncate(question_dir(s) / "questions.parquet"),
        run_fix=True,
    ),
    Case(
        "verify: feature meta.json not JSON",
        "walla-store",
        verify_argv,
        "meta.json: not valid JSON",
        damage=lambda s: (feature_dir(s) / "meta.json").write_text("{half"),
        run_fix=True,
    ),
    Case(
        "verify: question meta.json not UTF-8",
        "walla-store",
        verify_argv,
        "meta.json: not UTF-8 text",
        damage=lambda s: (question_dir(s) / "meta.json").write_bytes(b"\xff\xfe{}"),
        run_fix=True,
    ),
    Case(
        "verify: feature meta.json is a directory",
        "walla-store",
        verify_argv,
        "meta.json: is a directory, expected a file",
        damage=lambda s: replace_with_dir(feature_dir(s) / "meta.json"),
        run_fix=True,
    ),
    Case(
        "rm: prefix too short",
        "walla-store",
        lambda s, t: ["rm", "ab", "--store", str(s), "--yes"],
        "prefix 'ab' is too short",
        code=2,
    ),
    Case(
        "rm: no such fingerprint",
        "walla-store",
        lambda s, t: ["rm", "ffffffff", "--store", str(s), "--yes"],
        "no entry of",
        code=1,
    ),
    Case(
        "rm in a store that does not exist",
        "walla-store",
        lambda s, t: ["rm", "abcdef", "--store", str(t / "nowhere"), "--yes"],
        "nowhere does not exist",
    ),
    Case(
        "verify: unknown fingerprint prefix",
        "walla-store",
        lambda s, t: ["verify", "ffffffff", "--store", str(s)],
        "no entry of",
    ),
]


def _run_fix(line: str) -> None:
    """Run the `fix: `a && b`` the message names, exactly as written (each part through its CLI)."""
    fix = line.split("fix: `", 1)[1].rsplit("`", 1)[0]
    for part in fix.split(" && "):
        argv = shlex.split(part)
        r = invoke(argv[0], argv[1:])
        assert r.exit_code == 0, (part, r.output, r.stderr)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(case: Case, base_store: Path, tmp_path: Path) -> None:
    if case.name.startswith("--device cuda") and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    store = tmp_path / "store"
    shutil.copytree(base_store, store)
    if case.damage is not None:
        case.damage(store)
    r = invoke(case.cli, case.argv(store, tmp_path))
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code != 0, (r.output, r.stderr)
    if case.code is not None:
        assert r.exit_code == case.code, r.stderr
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert len(lines) == 1, r.stderr
    assert case.names in lines[0], lines[0]
    assert "Traceback" not in r.output + r.stderr
    if case.run_fix:
        assert "fix: `walla store rm " in lines[0], lines[0]
        _run_fix(lines[0])
    v = invoke("walla-store", ["verify", "--store", str(store)])
    assert v.exit_code == 0, (v.output, v.stderr)
    read_feature_set(feature_dir(store))


def test_case_count() -> None:
    assert len(CASES) >= 20


def test_tampered_chunk_is_refused_by_the_reader(base_store: Path, tmp_path: Path) -> None:
    """Issue 12 #1: the reader trained on XOR-ed hidden values (read_feature_set(..., verify=False))."""
    store = tmp_path / "store"
    shutil.copytree(base_store, store)
    chunk = feature_dir(store) / "hidden.zarr" / "c" / "0" / "0"
    flip_byte(chunk)
    with pytest.raises(StoreError, match=r"checksum mismatch: .*hidden.zarr/c/0/0.*fix: `walla store rm "):
        read_feature_set(feature_dir(store))


def test_second_extract_refuses_before_loading_the_model(
    base_store: Path, tmp_path: Path, monkeypatch
) -> None:
    store = tmp_path / "store"
    shutil.copytree(base_store, store)
    path = feature_dir(store)

    def no_model(*a, **k):
        raise AssertionError("the model was loaded although another writer holds the lock")

    monkeypatch.setattr(DUMMY, "load", no_model)
    with filelock.FileLock(str(path.with_name(path.name + ".lock")), timeout=0):  # "another walla extract"
        r = invoke("walla extract", extract(store, "--dataset", "facts", "--size", "20"))
    assert r.exit_code == 1 and "is being written by another process" in r.stderr, (r.output, r.stderr)
    assert invoke("walla-store", ["verify", "--store", str(store)]).exit_code == 0


def test_disk_full_names_the_file(base_store: Path, tmp_path: Path, monkeypatch) -> None:
    """A full disk inside an atomic write is one line naming the file (not a bare '[Errno 28]')."""
    import errno

    from walla.store import atomic

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic, "replace", full)
    r = invoke("walla extract", extract(tmp_path / "store", "--dataset", "facts", "--size", "20"))
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 1 and len(lines) == 1, r.stderr
    assert "questions.parquet: disk full (no space left on the device)" in lines[0], lines[0]
