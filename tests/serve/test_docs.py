"""docs/serve.md's curl and `openai` examples run against a served pool (the tiny one) and succeed."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "serve.md"
DOC_URL = "http://127.0.0.1:8766"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def test_curl_examples_answer(serving):
    (shell,) = [b for b in blocks("bash") if "curl" in b]
    script = "set -e\n" + shell.replace(f"URL={DOC_URL}", f"URL={serving.url}").replace(
        "curl -s ", "curl -s --fail-with-body "
    )
    env = {
        "TOKEN": serving.caller_token,
        "OP_TOKEN": serving.op["Authorization"].split()[1],
        "PATH": "/usr/bin:/bin",
    }
    res = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count('"probabilities"') >= 3 and '"payouts"' in res.stdout, res.stdout
    assert serving.ledger.get_round(1)["status"] == "resolved"


def test_openai_example_runs(serving, capsys):
    pytest.importorskip("openai")
    (code,) = [b for b in blocks("python") if "OpenAI(" in b]
    code = code.replace(DOC_URL, serving.url).replace("YOUR-TOKEN", serving.caller_token)
    exec(compile(code, str(DOC), "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[0] in ("Yes", "No") and "'Yes':" in out[1], out
