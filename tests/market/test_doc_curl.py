"""docs/market.md's curl session runs as written against a live market (issue 37, finding 9: the report and
resolve examples sent no JSON Content-Type and got 400). Each `curl` of the "Rounds over HTTP" block is sent
as curl would send it (`-d` without a Content-Type is form-encoded, as curl's is); an answer shown as
`# {"error": ...}  (4xx)` must be that error and status, every other answer a 2xx.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import httpx

DOC = Path(__file__).resolve().parents[2] / "docs" / "market.md"
SHOWN_ERROR = re.compile(r"^# (\{\"error\":.*\})\s+\((\d{3})\)$")


def curl_session(doc: Path = DOC) -> list[tuple[str, str | None, int | None]]:
    """(command line, the error shown under it, its status) of each curl in the 'Rounds over HTTP' block,
    with the block's plain `NAME=value` lines as variables (the tokens and $M are the test's)."""
    text = doc.read_text(encoding="utf-8").split("## Rounds over HTTP", 1)[1]
    block = text.split("```bash", 1)[1].split("```", 1)[0]
    out: list[list] = []
    pending = ""
    for line in block.splitlines():
        line = line.strip()
        if pending or line.startswith("curl "):  # a command goes on past a trailing \ or an open quote
            pending = f"{pending} {line}".strip()
            if not pending.endswith("\\") and _complete(pending):
                out.append([pending, None, None])
                pending = ""
            pending = pending.removesuffix("\\")
        elif (m := SHOWN_ERROR.match(line)) and out:
            out[-1][1:] = [m.group(1), int(m.group(2))]
        elif re.match(r"^\w+=", line) and ";" not in line:
            out.append([line, None, None])
    return [tuple(x) for x in out]


def _complete(line: str) -> bool:
    try:
        shlex.split(line, comments=True)
    except ValueError:  # "No closing quotation": the quoted -d body goes on on the next line
        return False
    return True


def run_curl(line: str, env: dict[str, str]) -> httpx.Response:
    """Send one curl command line (-s, -X, -H, -d and the URL) as curl sends it."""
    words = [re.sub(r"\$(\w+)", lambda m: env[m.group(1)], w) for w in shlex.split(line, comments=True)[1:]]
    method, headers, data, url = None, {}, None, None
    it = iter(words)
    for w in it:
        if w == "-X":
            method = next(it)
        elif w == "-H":
            k, _, v = next(it).partition(":")
            headers[k.strip()] = v.strip()
        elif w == "-d":
            data = next(it)
        elif w != "-s":
            url = w
    if data is not None:
        headers.setdefault("Content-Type", "application/x-www-form-urlencoded")  # curl's default for -d
    return httpx.request(
        method or ("POST" if data is not None else "GET"), url, content=data, headers=headers
    )


def test_the_docs_curl_session_runs_as_written(market):
    alice, bob = market.agent("alice"), market.agent("bob")
    env = {
        "M": market.url,
        "OP": market.op.http.headers["authorization"].split()[1],
        "ALICE": alice.http.headers["authorization"].split()[1],
        "BOB": bob.http.headers["authorization"].split()[1],
    }
    session = curl_session()
    assert sum(line.startswith("curl") for line, _, _ in session) >= 10
    for line, shown, status in session:
        if not line.startswith("curl"):
            name, _, value = line.partition("=")
            env[name] = shlex.split(value)[0]
            continue
        r = run_curl(line, env)
        if status is None:
            assert r.is_success, f"{line}\n-> HTTP {r.status_code} {r.text}"
        else:
            assert (r.status_code, r.json()) == (status, json.loads(shown)), f"{line}\n-> {r.text}"
    assert market.op.round(1)["status"] == "resolved"
