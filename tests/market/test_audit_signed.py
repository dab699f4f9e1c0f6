"""An audit an intruder with database access cannot talk round (issue 46, findings 1 and 2; issue 47, items
4 and 5), on SQLite and PostgreSQL.

Each case was reproduced on the audit before it: a well-formed event appended after the last head (alice's
token rotated to the intruder's) audited OK with and without --head and --key-file; a head file cut to its
first line, deleted, or with its lines reordered audited OK; the OK line said "every row proved" with no head
file checked; a value nested 100,000 deep in reports.probabilities or an event's data printed a traceback.
The intruder here can write the database and the head file, but does not hold the market's key.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from market_fixtures import OP_TOKEN, wait_until
from sqlalchemy import text
from test_audit import _busy_market, _db_arg
from test_audit_state import _audit, _fails_with, _rechain, _zero_a_settled_wager
from walla.market import events
from walla.market.cli import run_market
from walla.market.client import MarketClient, wait_ready
from walla.market.keys import key_id
from walla.market.launch import TOKEN_ENV
from walla.market.ledger.common import hash_token, token_check
from walla.market.local import free_port

KEY = b"the market's key, kept off the database's machine"
OLD = b"the key the market was signed with before"
SERVE = "from walla.market.cli._operator import app; app(prog_name='walla market')"  # as test_fault.py


@pytest.fixture
def signed(market, tmp_path):
    """(market, its db argument, the key file): the live server signs every event with KEY from event 2 on
    (event 1, the operator the fixture made, is unsigned), over a busy market."""
    assert market.ledger.sign_with([KEY]).startswith("the ledger's events 1..1 are unsigned")
    _busy_market(market)
    key = tmp_path / "market.key"
    key.write_bytes(KEY + b"\n")
    return market, _db_arg(market.ledger), key


def _forge_rotation(conn, mac: str | None) -> int:
    """Alice's token rotated to the intruder's: her row and a well-formed token_rotated event chained to the
    last one, with `mac` (the intruder has no key to compute one)."""
    last = conn.execute(text("SELECT id, hash, mac FROM events ORDER BY id DESC LIMIT 1")).first()
    th = hash_token("wm_the-intruders-token")
    data = events.canonical({"token": token_check(th)})
    eid, at = last.id + 1, 1.9e9
    h = events.link(last.hash, eid, at, "token_rotated", None, 2, data)
    conn.execute(
        text(
            "INSERT INTO events (id, at, kind, round_id, agent_id, data, prev_hash, hash, mac) "
            "VALUES (:i, :at, 'token_rotated', NULL, 2, :d, :p, :h, :m)"
        ),
        {"i": eid, "at": at, "d": data, "p": last.hash, "h": h, "m": mac if mac != "copy" else last.mac},
    )
    conn.execute(text("UPDATE agents SET token_hash = :t WHERE name = 'alice'"), {"t": th})
    return eid


def test_a_forged_append_is_caught(signed, capfd, tmp_path):
    market, db, key = signed
    heads = tmp_path / "market.heads"
    rc, out, err = _audit(db, capfd, "--head", str(heads), "--key-file", str(key))
    assert rc == 0 and "signed from event 2, MACs verified with the key" in out, (out, err)
    with market.ledger.engine.begin() as conn:
        eid = _forge_rotation(conn, None)
    unsigned = f"events: row {eid} (token_rotated) has no MAC, but the ledger is signed from event 2 on"
    for extra in ((), ("--head", str(heads)), ("--key-file", str(key))):
        _fails_with(db, capfd, unsigned, *extra)
    with market.ledger.engine.begin() as conn:  # a MAC copied from the row before: only the key tells
        conn.execute(
            text("UPDATE events SET mac = (SELECT mac FROM events WHERE id = :p) WHERE id = :i"),
            {"p": eid - 1, "i": eid},
        )
    forged = f"events: row {eid} (token_rotated) MAC does not verify with key {key_id(KEY)}"
    _fails_with(db, capfd, forged, "--key-file", str(key))
    _fails_with(db, capfd, forged, "--head", str(heads), "--key-file", str(key))
    rc, out, _ = _audit(db, capfd)  # without the key the audit cannot tell, and says so on its OK line
    assert rc == 0 and "MACs not checked (no --key-file)" in out, out


def test_a_rewritten_signed_chain_fails_its_macs_without_a_head_file(signed, capfd):
    """Zeroing a settled wager and recomputing every hash (the intruder's _rechain) breaks the MACs."""
    market, db, key = signed
    with market.ledger.engine.begin() as conn:
        _zero_a_settled_wager(conn)
        _rechain(conn)
    _fails_with(db, capfd, "MAC does not verify with key", "--key-file", str(key))


def _two_heads(market, heads):
    """Line 1 written by the server, more business, line 2: ledger.record_head, as HeadWriter calls it."""
    assert market.ledger.record_head(heads) == 1
    market.op.resolve(5, label=1)
    assert market.ledger.record_head(heads) == 2
    assert market.ledger.record_head(heads) is None  # nothing new since line 2: no line
    return heads.read_text().splitlines()


def test_a_cut_head_file_is_caught(signed, capfd, tmp_path):
    market, db, key = signed
    heads = tmp_path / "market.heads"
    lines = _two_heads(market, heads)
    assert _audit(db, capfd, "--head", str(heads), "--key-file", str(key))[0] == 0
    heads.write_text(lines[0] + "\n")
    cut = f"{heads}: ends at line 1, but the ledger's event"
    _fails_with(db, capfd, cut, "--head", str(heads), "--key-file", str(key))
    _fails_with(db, capfd, cut, "--head", str(heads))
    heads.write_text("")
    _fails_with(db, capfd, f"{heads}: holds no head, but the ledger's event", "--head", str(heads))
    with pytest.raises(ValueError, match="the head file was cut"):  # and the server does not paper it over
        market.ledger.record_head(heads)


def test_a_deleted_head_file_is_caught_unless_it_is_new(signed, capfd, tmp_path):
    market, db, key = signed
    heads = tmp_path / "market.heads"
    _two_heads(market, heads)
    heads.unlink()
    gone = f"{heads}: no such head file, but the ledger's event"
    _fails_with(db, capfd, gone, "--head", str(heads), "--key-file", str(key))
    _fails_with(db, capfd, gone, "--head", str(heads))
    with pytest.raises(ValueError, match="no such head file"):
        market.ledger.record_head(heads)
    rc, out, err = _audit(db, capfd, "--head", str(heads), "--key-file", str(key), "--new-head-file")
    assert rc == 0 and heads.exists(), err
    assert _audit(db, capfd, "--head", str(heads), "--key-file", str(key))[0] == 0
    assert market.ledger.record_head(heads) == 1  # the server notes the audit's line 1 of the new file
    market.op.open_round("q6", ["x", "y"])
    assert market.ledger.record_head(heads) == 2  # and goes on in it
    assert _audit(db, capfd, "--head", str(heads), "--key-file", str(key))[0] == 0


def test_new_head_file_is_refused_on_a_file_that_exists(signed, capfd, tmp_path):
    market, db, key = signed
    heads = tmp_path / "market.heads"
    _two_heads(market, heads)
    rc, _, err = _audit(db, capfd, "--head", str(heads), "--new-head-file")
    assert rc == 2 and "--new-head-file: " in err and "exists (it is not the first)" in err, err


def test_reordered_head_lines_are_caught(signed, capfd, tmp_path):
    market, db, key = signed
    heads = tmp_path / "market.heads"
    lines = _two_heads(market, heads)
    heads.write_text(f"{lines[1]}\n{lines[0]}\n")
    _fails_with(
        db,
        capfd,
        "line 1: its HMAC does not verify with the key",
        "--head",
        str(heads),
        "--key-file",
        str(key),
    )
    first, second = int(lines[0].split()[0]), int(lines[1].split()[0])
    _fails_with(
        db,
        capfd,
        f"line 2: head {first} is older than line 1's head {second} (heads only move forward",
        "--head",
        str(heads),
    )


def test_a_replaced_last_hash_is_caught(signed, capfd, tmp_path):
    market, db, key = signed
    heads = tmp_path / "market.heads"
    lines = _two_heads(market, heads)
    eid, h, mac = lines[1].split()
    heads.write_text(f"{lines[0]}\n{eid} {'ab' * 32} {mac}\n")
    _fails_with(db, capfd, "line 2: its HMAC does not verify", "--head", str(heads), "--key-file", str(key))
    _fails_with(
        db, capfd, f"events: row {eid}'s hash is not the one {heads} line 2 recorded", "--head", str(heads)
    )


def test_an_audit_without_the_key_appends_nothing_to_a_signed_head_file(signed, capfd, tmp_path):
    """An unsigned line after signed ones would break the file for every audit with the key."""
    market, db, key = signed
    heads = tmp_path / "market.heads"
    lines = _two_heads(market, heads)
    market.op.open_round("q6", ["x", "y"])
    assert _audit(db, capfd, "--head", str(heads))[0] == 0
    assert heads.read_text().splitlines() == lines
    assert _audit(db, capfd, "--head", str(heads), "--key-file", str(key))[0] == 0
    assert len(heads.read_text().splitlines()) == 3


def test_the_ok_line_says_when_the_chain_is_not_anchored(market, capfd, tmp_path):
    """Issue 47 item 4: no --head, no "every row proved"."""
    _busy_market(market)
    db = _db_arg(market.ledger)
    rc, out, _ = _audit(db, capfd)
    assert rc == 0 and "chain not anchored (no --head)" in out and "every row proved" not in out, out
    assert "unsigned (no key_set event" in out
    rc, out, _ = _audit(db, capfd, "--head", str(tmp_path / "m.heads"))
    assert rc == 0 and "every row proved from them" in out and "not anchored" not in out, out


DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    "edit, needle",
    [
        (
            "UPDATE reports SET probabilities = :v WHERE id = 1",
            "reports: row id 1 column probabilities: '[[[[",
        ),
        ("UPDATE events SET data = :v WHERE id = 3", 'events: row id 3 column data: \'{"a":[[['),
    ],
)
def test_json_nested_too_deep_is_one_line_naming_the_row(market, capfd, edit, needle):
    """Issue 47 item 5: a value nested 100,000 deep is one line, not a RecursionError's traceback."""
    _busy_market(market)
    value = DEEP if "reports" in edit else '{"a":' + DEEP + "}"
    with market.ledger.engine.begin() as conn:
        conn.execute(text(edit), {"v": value})
    _fails_with(_db_arg(market.ledger), capfd, needle)
    _, _, err = _audit(_db_arg(market.ledger), capfd)
    assert "(nested too deeply to parse)" in err, err


def test_keys_sign_from_the_first_keyed_command_and_rotate_with_the_old_key(database, tmp_path, capfd):
    """An unsigned ledger gets one line saying so; a key file with the new key above the old one rotates
    (an event signed by the old key); the audit needs both keys, and a command without a key is refused."""
    new, both, old = tmp_path / "new.key", tmp_path / "both.key", tmp_path / "old.key"
    new.write_bytes(KEY + b"\n")
    old.write_bytes(OLD + b"\n")
    both.write_bytes(KEY + b"\n" + OLD + b"\n")
    assert run_market(["init", "--db", database], "walla market") == 0
    assert run_market(["add-agent", "alice", "--db", database], "walla market") == 0
    capfd.readouterr()
    assert run_market(["add-agent", "bob", "--db", database, "--key-file", str(old)], "walla market") == 0
    err = capfd.readouterr().err.strip().splitlines()
    assert err == [
        f"walla market: the ledger's events 1..2 are unsigned (written before it had a key); signed from "
        f"event 3 on with key {key_id(OLD)}"
    ], err
    rc = run_market(["add-agent", "carol", "--db", database], "walla market")
    err = capfd.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "the ledger's events are signed from event 3 on" in err[0], err
    rc = run_market(["add-agent", "carol", "--db", database, "--key-file", str(new)], "walla market")
    err = capfd.readouterr().err.strip().splitlines()
    assert (
        rc == 1
        and len(err) == 1
        and f"signed by key {key_id(OLD)}, which the key file does not hold" in err[0]
    )
    assert run_market(["add-agent", "carol", "--db", database, "--key-file", str(both)], "walla market") == 0
    err = capfd.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1 and f"signed by the old key {key_id(OLD)}, hands signing to key {key_id(KEY)}" in err[0]
    )
    rc, out, err = _audit(database, capfd, "--key-file", str(both))
    assert rc == 0 and "1..2 unsigned, signed from event 3, MACs verified with the key" in out, (out, err)
    _fails_with(
        database,
        capfd,
        f"is signed by key {key_id(OLD)}, which the key file does not hold",
        "--key-file",
        str(new),
    )


def test_a_server_refuses_to_start_without_a_key_unless_unsigned(tmp_path, capfd):
    db = str(tmp_path / "m.db")
    rc = run_market(["serve", "--db", db, "--port", "1"], "walla market")
    err = capfd.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert (
        "no key to sign the ledger's events: give --key-file FILE or $WALLA_MARKET_KEY (or --unsigned"
        in err[0]
    )
    assert not (tmp_path / "m.db").exists()


def test_a_ledger_made_before_events_had_macs(database, capfd):
    """Its events table lacks the mac column: the read-only audit reads NULL (unsigned), a writer adds it."""
    from walla.market.ledger import Ledger

    ledger = Ledger.open(database)
    ledger.ensure_operator("operator-token-0123456789")
    with ledger.engine.begin() as conn:
        conn.execute(text("ALTER TABLE events DROP COLUMN mac"))
    ledger.close()
    rc, out, err = _audit(database, capfd)
    assert rc == 0 and "1 events chained, unsigned" in out, (out, err)
    Ledger.open(database).close()
    with Ledger.open(database).engine.connect() as conn:
        assert conn.execute(text("SELECT mac FROM events")).all() == [(None,)]


def test_walla_market_serve_signs_and_appends_its_heads(database, tmp_path, capfd):
    """Issue 47 item 4: the server appends its signed head to --head-file every --head-every seconds, and
    the audit anchored on that file with the key proves every row."""
    key, heads, port = tmp_path / "market.key", tmp_path / "market.heads", free_port()
    key.write_bytes(KEY + b"\n")
    argv = ["serve", "--db", database, "--port", str(port), "--key-file", str(key)]
    argv += ["--head-file", str(heads), "--head-every", "0.2"]
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, *argv],
        env={**os.environ, TOKEN_ENV: OP_TOKEN},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_ready(f"http://127.0.0.1:{port}", timeout=60)
        op = MarketClient(f"http://127.0.0.1:{port}", OP_TOKEN)
        for i in range(3):
            n = len(heads.read_text().splitlines())  # before the write: the writer is idle until it
            op.open_round(f"q{i}", ["x", "y"])
            assert wait_until(lambda n=n: len(heads.read_text().splitlines()) > n, timeout=10)
        op.close()
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "Traceback" not in err, err
    lines = heads.read_text().splitlines()
    assert len(lines) >= 4 and all(len(line.split()) == 3 for line in lines), lines
    rc, out, err = _audit(database, capfd, "--head", str(heads), "--key-file", str(key))
    assert rc == 0 and "signed from event 1, MACs verified with the key, every row proved" in out, (out, err)


def test_a_server_told_unsigned_says_so_in_one_line(database, capfd):
    """The helper both servers call (operator_commands.sign_ledger): --unsigned serves, with one line."""
    from walla.market.commands import sign_ledger
    from walla.market.ledger import Ledger

    ledger = Ledger.open(database)
    try:
        sign_ledger(ledger, [], "market")
        err = capfd.readouterr().err.strip().splitlines()
        assert err == ["walla market: serving unsigned (--unsigned): the audit cannot tell a forged event"], (
            err
        )
        assert ledger.key is None
    finally:
        ledger.close()
