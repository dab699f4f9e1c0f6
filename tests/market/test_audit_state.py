"""The audit proves the state and anchors the chain (issue 37 finding 7).

Each case was reproduced on the audit that checked events only: an edit of a row the event log describes
(a round's c3 before its resolution, a token hash, a revocation, a question, options, a note) audited OK;
so did a chain whose hashes were recomputed after an edit, a deletion with renumbering or a reordering; a
malformed stored value printed a traceback; an empty file or another program's database got the market's
tables and "OK".
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text
from test_audit import _busy_market, _db_arg, _not_ledgers
from walla.market import events
from walla.market.api import RoundSettings
from walla.market.cli import run_market
from walla.market.payouts import round_payouts


def _audit(db: str, capfd, *extra: str) -> tuple[int, str, str]:
    rc = run_market(["audit", "--db", db, *extra], "walla market")
    out, err = capfd.readouterr()
    return rc, out, err


def _fails_with(db: str, capfd, needle: str, *extra: str) -> None:
    rc, out, err = _audit(db, capfd, *extra)
    lines = err.strip().splitlines()
    assert rc == 1 and len(lines) == 1 and needle in lines[0] and "Traceback" not in err, (rc, out, err)


def test_resolve_pays_the_recorded_settings_and_the_audit_names_the_edited_c3(market, capfd):
    """c3 of an open round edited in the database from 0.5 to 1e6: the resolution over HTTP pays with the
    settings the round's opening event recorded, and the audit names the edited column."""
    alice, bob = market.agent("alice"), market.agent("bob")
    rid = market.op.open_round("q", ["x", "y"])["id"]
    alice.submit(rid, [0.9, 0.1], 0.5)
    bob.submit(rid, [0.2, 0.8], 0.5)
    with market.ledger.engine.begin() as conn:
        conn.execute(text("UPDATE rounds SET c3 = 1e6 WHERE id = :r"), {"r": rid})
    paid = market.op.resolve(rid, label=0)["payouts"]
    want = round_payouts([[0.9, 0.1], [0.2, 0.8]], [0.5, 0.5], [1.0, 0.0], RoundSettings())
    assert [paid["alice"], paid["bob"]] == want.payout
    _fails_with(
        _db_arg(market.ledger),
        capfd,
        f"rounds: row id {rid} column c3 is 1000000.0 but the event log says 0.5",
    )


@pytest.mark.parametrize(
    "edit, needle",
    [
        (  # account takeover: alice's token hash replaced by one whose token the editor holds
            "UPDATE agents SET token_hash = '" + "ab" * 32 + "' WHERE name = 'alice'",
            "agents: row id 2 column token_hash is not the token its events set",
        ),
        ("UPDATE agents SET revoked_at = NULL WHERE name = 'carol'", "agents: row id 4 column revoked_at"),
        ("UPDATE agents SET floor = -1000 WHERE name = 'bob'", "agents: row id 3 column floor"),
        ("UPDATE rounds SET question = 'q9' WHERE id = 1", "rounds: row id 1 column question is 'q9'"),
        ('UPDATE rounds SET options = \'["x","y","w"]\' WHERE id = 5', "rounds: row id 5 column options"),
        (
            "UPDATE resolutions SET note = 'edited' WHERE round_id = 2 AND seq = 2",
            "resolutions: round 2 seq 2 column note",
        ),
        ("UPDATE reports SET version = 7 WHERE id = 1", "reports: row id 1 column version is 7"),
        ("DELETE FROM payouts WHERE kind = 'reverse'", "is in the event log but not in the table"),
    ],
)
def test_audit_names_a_row_that_differs_from_the_event_log(market, capfd, edit, needle):
    _busy_market(market)
    db = _db_arg(market.ledger)
    assert _audit(db, capfd)[0] == 0
    with market.ledger.engine.begin() as conn:
        conn.execute(text(edit))
    _fails_with(db, capfd, needle)


MALFORMED = [
    (
        "UPDATE reports SET probabilities = 'abc' WHERE id = 1",
        "reports: row id 1 column probabilities: 'abc' is not",
    ),
    (
        "UPDATE resolutions SET target = '{}' WHERE round_id = 1",
        "resolutions: round 1 seq 1 column target: '{}' is not",
    ),
    ("UPDATE events SET data = '[1' WHERE id = 3", "events: row id 3 column data: '[1' is not a JSON object"),
    ("UPDATE rounds SET options = '[1, 2, 3]' WHERE id = 1", "rounds: row id 1 column options"),
]
SQLITE_ONLY = [  # PostgreSQL refuses these edits itself (typed columns)
    (
        "UPDATE payouts SET payout = 'lots' WHERE id = 1",
        "payouts: row id 1 column payout: 'lots' is not a finite number",
    ),
    (
        "UPDATE reports SET version = 'two' WHERE id = 1",
        "reports: row id 1 column version: 'two' is not an integer",
    ),
    ("UPDATE rounds SET c1 = 'NaN' WHERE id = 1", "rounds: row id 1 column c1: 'NaN' is not a finite number"),
]


@pytest.mark.parametrize("edit, needle", MALFORMED + SQLITE_ONLY)
def test_a_malformed_value_is_one_line_naming_its_column(market, capfd, edit, needle):
    if (edit, needle) in SQLITE_ONLY and market.ledger.engine.dialect.name != "sqlite":
        pytest.skip("PostgreSQL's typed columns refuse this edit")
    _busy_market(market)
    with market.ledger.engine.begin() as conn:
        conn.execute(text(edit))
    _fails_with(_db_arg(market.ledger), capfd, needle)


def test_an_empty_file_or_another_programs_database_is_not_a_ledger(tmp_path, capfd):
    """One line, exit 1, and the file as it was: the audit opens read-only and creates nothing."""
    empty, foreign = _not_ledgers(tmp_path)
    before = foreign.read_bytes()
    for path in (empty, foreign):
        _fails_with(str(path), capfd, f"audit of {path}: not a walla market ledger (no table")
    assert empty.stat().st_size == 0 and foreign.read_bytes() == before
    junk = tmp_path / "junk.db"
    junk.write_text("hello, not a database\n" * 100)
    _fails_with(str(junk), capfd, f"audit of {junk}: not a walla market ledger (")


def _rechain(conn) -> None:
    """Recompute every event's prev_hash and hash from its stored columns: what an editor with write access
    to the database does to hide an edit (the chain has no key of its own)."""
    prev = events.GENESIS
    rows = conn.execute(text("SELECT id, at, kind, round_id, agent_id, data FROM events ORDER BY id")).all()
    for r in rows:
        h = events.link(prev, r.id, r.at, r.kind, r.round_id, r.agent_id, r.data)
        conn.execute(
            text("UPDATE events SET prev_hash = :p, hash = :h WHERE id = :i"), {"p": prev, "h": h, "i": r.id}
        )
        prev = h


def _reorder(conn) -> None:
    """Swap two independent events (alice's second report to round 1 and her first to round 2)."""
    for a, b in ((11, -1), (12, 11), (-1, 12)):
        conn.execute(text("UPDATE events SET id = :b WHERE id = :a"), {"a": a, "b": b})


def _delete_settled_round(conn) -> None:
    """Round 1 (resolved) gone from every table and from the log, the events renumbered 1..n."""
    for table in ("payouts", "resolutions", "reports"):
        conn.execute(text(f"DELETE FROM {table} WHERE round_id = 1"))
    conn.execute(text("DELETE FROM rounds WHERE id = 1"))
    conn.execute(text("DELETE FROM events WHERE round_id = 1"))
    ids = conn.execute(text("SELECT id FROM events ORDER BY id")).scalars().all()
    for new, old in enumerate(ids, start=1):
        conn.execute(text("UPDATE events SET id = :n WHERE id = :o"), {"n": new, "o": old})


def _zero_a_settled_wager(conn) -> None:
    """Alice's wager in resolved round 1 set to 0 in her report, its event, and every payout recomputed."""
    last = conn.execute(
        text(
            "SELECT id, data FROM events WHERE kind = 'report' AND round_id = 1 AND agent_id = 2 ORDER BY id DESC"
        )
    ).first()
    data = {**json.loads(last.data), "wager": 0.0}
    conn.execute(
        text("UPDATE events SET data = :d WHERE id = :i"), {"d": events.canonical(data), "i": last.id}
    )
    conn.execute(text("UPDATE reports SET wager = 0.0 WHERE round_id = 1 AND agent_id = 2"))
    reps = conn.execute(
        text("SELECT id, agent_id, probabilities, wager FROM reports WHERE round_id = 1 ORDER BY agent_id")
    ).all()
    s = RoundSettings.model_construct(
        **dict(
            conn.execute(text("SELECT variant, c1, c2, c3, pooling FROM rounds WHERE id = 1"))
            .first()
            ._mapping
        )
    )
    pay = round_payouts(
        [json.loads(r.probabilities) for r in reps], [r.wager for r in reps], [1.0, 0.0, 0.0], s
    )
    for i, r in enumerate(reps):
        values = {k: getattr(pay, k)[i] for k in ("score", "baseline", "advantage", "payout")}
        conn.execute(
            text(
                "UPDATE payouts SET wager = :w, score = :score, baseline = :baseline, advantage = :advantage, "
                "payout = :payout WHERE round_id = 1 AND agent_id = :a"
            ),
            {"w": r.wager, "a": r.agent_id, **values},
        )
    conn.execute(text("UPDATE resolutions SET total_payout = :t WHERE round_id = 1"), {"t": pay.total})
    ev = conn.execute(text("SELECT id, data FROM events WHERE kind = 'resolved' AND round_id = 1")).first()
    data = {
        **json.loads(ev.data),
        "total_payout": pay.total,
        "payouts": {str(r.agent_id): pay.payout[i] for i, r in enumerate(reps)},
    }
    conn.execute(text("UPDATE events SET data = :d WHERE id = :i"), {"d": events.canonical(data), "i": ev.id})


@pytest.mark.parametrize("rewrite", [_reorder, _delete_settled_round, _zero_a_settled_wager])
def test_a_rewritten_chain_is_caught_by_the_recorded_head(market, capfd, tmp_path, rewrite):
    """The rewrite is consistent (the audit without a head passes: nothing in the database alone shows it),
    and `--head FILE` with the head recorded before catches it; with a key, so does an edited head file."""
    _busy_market(market)
    db, heads, key = _db_arg(market.ledger), tmp_path / "market.heads", tmp_path / "audit.key"
    key.write_text("a secret kept off the database's machine\n")
    rc, out, err = _audit(db, capfd, "--head", str(heads), "--key-file", str(key))
    assert rc == 0 and "head " in out and not err, (out, err)
    recorded = heads.read_text().split()
    assert len(recorded) == 3 and int(recorded[0]) == market.ledger.counts()["events"]
    assert _audit(db, capfd, "--head", str(heads), "--key-file", str(key))[0] == 0
    assert heads.read_text().split() == recorded  # an unchanged head is not appended twice
    with market.ledger.engine.begin() as conn:
        rewrite(conn)
        _rechain(conn)
    rc, out, err = _audit(db, capfd)
    assert rc == 0, err
    _fails_with(db, capfd, "the chain", "--head", str(heads))
    with market.ledger.engine.connect() as conn:  # the editor rewrites the head file too, without the key
        eid, new = conn.execute(text("SELECT id, hash FROM events ORDER BY id DESC LIMIT 1")).first()
    heads.write_text(f"{eid} {new} {recorded[2]}\n")
    _fails_with(db, capfd, "line 1: its HMAC does not verify", "--head", str(heads), "--key-file", str(key))


def _as_older_walla(conn, fields: dict[str, tuple[str, ...]]) -> None:
    """Events as a walla before the audit proved the state wrote them: `fields` (by kind) absent from their
    data, the chain linked over what is stored (that walla's chain verified)."""
    for kind, drop in fields.items():
        for r in conn.execute(text("SELECT id, data FROM events WHERE kind = :k"), {"k": kind}).all():
            data = {k: v for k, v in json.loads(r.data).items() if k not in drop}
            conn.execute(
                text("UPDATE events SET data = :d WHERE id = :i"), {"d": events.canonical(data), "i": r.id}
            )
    _rechain(conn)


@pytest.mark.parametrize(
    "fields, needle",
    [
        (  # the operator's first event had no data; agents' events had no token check
            {"operator_added": ("name", "token"), "agent_added": ("token",), "token_rotated": ("token",)},
            "event 1 (operator_added) lacks fields name, token, so the audit cannot prove agents.name, "
            "agents.token_hash",
        ),
        ({"report": ("id",)}, "(report) lacks field id, so the audit cannot prove reports.id"),
    ],
)
def test_a_ledger_of_an_older_walla_names_the_field_it_lacks(market, capfd, fields, needle):
    """Its events lack data the audit needs to prove a column: one line saying so plainly, exit 1 (no value
    made up for them, no 'malformed' or 'edited')."""
    _busy_market(market)
    db = _db_arg(market.ledger)
    assert _audit(db, capfd)[0] == 0
    with market.ledger.engine.begin() as conn:
        _as_older_walla(conn, fields)
    _fails_with(db, capfd, needle)
    _fails_with(db, capfd, "ledger written by a walla older than its audit")
