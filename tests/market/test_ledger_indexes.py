"""A ledger made before an index existed gets it when it is next opened for writing (create_all makes the
indexes of the tables it creates only, never one missing from a table that exists: events.round_id's was
added after ledgers were in use)."""

from __future__ import annotations

from sqlalchemy import text
from walla.market import db
from walla.market.api import RoundSettings
from walla.market.ledger import Ledger

INDEXES = sorted(ix.name for t in db.metadata.sorted_tables for ix in t.indexes)


def _indexes(engine) -> set[str]:
    """The index names the database's own catalog lists (not SQLAlchemy's reflection, which skips
    expression indexes on SQLite)."""
    if engine.dialect.name == "sqlite":
        q = "SELECT name FROM sqlite_master WHERE type = 'index'"
    else:
        q = "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()"
    with engine.connect() as conn:
        return set(conn.execute(text(q)).scalars())


def test_reopening_a_ledger_adds_its_missing_indexes(database):
    assert "ix_events_round_id" in INDEXES
    ledger = Ledger.open(database)
    ledger.ensure_operator()
    rid = ledger.open_round("q", ["x", "y"], RoundSettings())["id"]
    assert set(INDEXES) <= _indexes(ledger.engine)
    with ledger.engine.begin() as conn:
        for name in INDEXES:
            conn.execute(text(f"DROP INDEX {name}"))
    assert not set(INDEXES) & _indexes(ledger.engine)
    ledger.close()
    for _ in range(2):  # idempotent: a second open finds them and changes nothing
        ledger = Ledger.open(database)
        assert set(INDEXES) <= _indexes(ledger.engine)
        assert ledger.get_round(rid)["question"] == "q"
        ledger.close()
