"""Bulk export of a ledger as Parquet: one file per table, for analysis and for keeping outside the database.

    written = export(open_readonly("market.db"), Path("out"))   # out/{agents,rounds,...,events}.parquet

Agents are written without their token hashes. Each file is written to a temporary name in the same
directory and renamed into place (a reader never sees half a file); the column types are the database's
(floats float64, ids int64, JSON columns as their text). The engine need only read: `walla market export`
opens the ledger read-only (audit.open_readonly), so exporting never writes to it, and every table is read
in one transaction (one snapshot).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy import Engine, select
from walla.market import db

TABLES = (
    "agents",
    "rounds",
    "reports",
    "resolutions",
    "payouts",
    "events",
)  # events hold every report version
SECRET = {"agents": ("token_hash",)}  # never leaves the database


def _arrow_type(column) -> pa.DataType:
    name = type(column.type).__name__
    return {"Integer": pa.int64(), "Double": pa.float64()}.get(name, pa.string())


def export(engine: Engine, out: Path) -> dict[str, int]:
    """Write every table of TABLES to out/<table>.parquet; returns the row count per table."""
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    with engine.connect() as conn:
        for name in TABLES:
            table = db.metadata.tables[name]
            cols = [c for c in table.columns if c.name not in SECRET.get(name, ())]
            pk = list(table.primary_key.columns)
            rows = list(conn.execute(select(*cols).order_by(*pk)))
            schema = pa.schema([(c.name, _arrow_type(c)) for c in cols])
            data = pa.table({c.name: [getattr(r, c.name) for r in rows] for c in cols}, schema=schema)
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".parquet", dir=out)
            os.close(fd)
            try:
                pq.write_table(data, tmp)
                os.replace(tmp, out / f"{name}.parquet")
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            written[name] = len(rows)
    return written
