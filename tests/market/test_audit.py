"""`walla market audit` and `export` (issue 29): the chain verifies and every payout is recomputed from the
stored reports on a market with a voided round and a corrected resolution (exit 0); after one payout row,
event or report is edited by hand, the audit exits 1 with one line naming that row."""

from __future__ import annotations

import sqlite3

import pyarrow.parquet as pq
import pytest
from sqlalchemy import text
from walla.market.cli import run_market


def _db_arg(ledger) -> str:
    url = ledger.engine.url.render_as_string(hide_password=False)
    return url.replace("sqlite:///", "").replace("postgresql+psycopg://", "postgresql://")


def _busy_market(market) -> None:
    """Resolved, corrected, voided (open and resolved) and still-open rounds, with replaced reports."""
    alice, bob, carol = (market.agent(n) for n in ("alice", "bob", "carol"))
    rids = [
        market.op.open_round(f"q{t}", ["x", "y", "z"], variant="II" if t % 2 else "I")["id"] for t in range(5)
    ]
    for i, a in enumerate((alice, bob, carol)):
        for t, rid in enumerate(rids):
            a.submit(rid, [0.2, 0.3, 0.5], 0.1 * (i + 1))
            a.submit(rid, [(1 + i + t) / 10, 0.2, 0.8 - (1 + i + t) / 10], 0.2 * (i + 1))
    market.op.resolve(rids[0], label=0)
    market.op.resolve(rids[1], target=[0.2, 0.5, 0.3])
    market.op.request("POST", f"/rounds/{rids[1]}/correct", json={"label": 2, "note": "gold fixed"})
    market.op.resolve(rids[2], label=1)
    market.op.request("POST", f"/rounds/{rids[2]}/void", json={"reason": "ambiguous"})
    market.op.request("POST", f"/rounds/{rids[3]}/void", json={"reason": "cancelled"})
    market.op.request("POST", "/agents/carol/revoke")


def _audit(db: str, capfd) -> tuple[int, str, str]:
    rc = run_market(["audit", "--db", db], "walla market")
    out, err = capfd.readouterr()
    return rc, out, err


def test_audit_passes_then_names_the_edited_row(market, capfd):
    _busy_market(market)
    db = _db_arg(market.ledger)
    rc, out, err = _audit(db, capfd)
    assert rc == 0 and "walla market audit: OK" in out and not err, (out, err)
    with market.ledger.engine.begin() as conn:
        pid, value = conn.execute(
            text("SELECT id, payout FROM payouts WHERE kind = 'pay' ORDER BY id LIMIT 1 OFFSET 4")
        ).first()
        conn.execute(text("UPDATE payouts SET payout = :v WHERE id = :i"), {"v": value + 1e-6, "i": pid})
    rc, out, err = _audit(db, capfd)
    lines = err.strip().splitlines()
    assert rc == 1 and len(lines) == 1 and f"payouts: row id {pid} " in lines[0], err
    with market.ledger.engine.begin() as conn:  # undone: the audit passes again
        conn.execute(text("UPDATE payouts SET payout = :v WHERE id = :i"), {"v": value, "i": pid})
    assert _audit(db, capfd)[0] == 0


@pytest.mark.parametrize(
    "edit, needle",
    [
        ("UPDATE events SET at = at + 1 WHERE id = 12", "events: row 12 (report) hash"),
        (
            "DELETE FROM events WHERE id > (SELECT max(id) - 3 FROM events)",
            "has no event (the event log was cut short?)",
        ),
        ("UPDATE reports SET wager = 0.6 WHERE id = 2", "reports: row id 2"),
    ],
)
def test_audit_names_edited_events_and_reports(market, capfd, edit, needle):
    _busy_market(market)
    with market.ledger.engine.begin() as conn:
        conn.execute(text(edit))
    rc, _, err = _audit(_db_arg(market.ledger), capfd)
    assert rc == 1 and len(err.strip().splitlines()) == 1 and needle in err, err


def test_export_parquet(market, tmp_path, capfd):
    _busy_market(market)
    counts = market.ledger.counts()
    assert (
        run_market(["export", "--db", _db_arg(market.ledger), "--to", str(tmp_path / "out")], "walla market")
        == 0
    )
    for name in ("reports", "resolutions", "payouts", "events", "rounds", "agents"):
        table = pq.read_table(tmp_path / "out" / f"{name}.parquet")
        assert table.num_rows == counts[name], name
    agents = pq.read_table(tmp_path / "out" / "agents.parquet")
    assert "token_hash" not in agents.column_names
    pays = pq.read_table(tmp_path / "out" / "payouts.parquet").to_pydict()
    assert set(pays["kind"]) == {"pay", "reverse"}
    assert "export:" in capfd.readouterr().out


def _not_ledgers(tmp_path) -> tuple:
    """An empty file and another program's SQLite database: neither is a walla market ledger."""
    empty = tmp_path / "empty.db"
    empty.touch()
    foreign = tmp_path / "other.db"
    with sqlite3.connect(foreign) as c:
        c.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    return empty, foreign


def test_export_of_an_empty_or_foreign_file_writes_nothing(tmp_path, capfd):
    """Export opens the database read-only, as the audit does: one line, exit 1, the file as it was and no
    Parquet written (it used to create the market's tables in it)."""
    empty, foreign = _not_ledgers(tmp_path)
    before = foreign.read_bytes()
    for path in (empty, foreign):
        out = tmp_path / f"out-{path.stem}"
        rc = run_market(["export", "--db", str(path), "--to", str(out)], "walla market")
        err = capfd.readouterr().err.strip().splitlines()
        assert rc == 1 and len(err) == 1, (rc, err)
        assert f"export of {path}: not a walla market ledger (no table agents)" in err[0], err
        assert not out.exists()
    assert empty.stat().st_size == 0 and foreign.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.db", "other.db"]  # no -wal, no -shm


def test_rounds_are_stamped(market):
    """The mechanism's settings and walla's version on every round, and in its opening event."""
    from importlib.metadata import version

    rid = market.op.open_round("q", ["x", "y"], variant="II", c2=0.25)["id"]
    rnd = market.op.round(rid)
    assert rnd["walla_version"] == version("walla")
    assert rnd["settings"] == {"variant": "II", "c1": 1.0, "c2": 0.25, "c3": 0.5, "pooling": "linear"}
    with market.ledger.engine.connect() as conn:
        data = conn.execute(text("SELECT data FROM events WHERE kind = 'round_opened'")).scalar()
    assert '"walla_version":"' in data and '"c2":0.25' in data
