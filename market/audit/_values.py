"""The audit's first pass: read every ledger row as the database holds it and check each stored value's type.

    rows, problem = read_rows(conn)     # {table: [raw rows]}; problem: one line naming table, row, column

Rows are read with plain SQL (no SQLAlchemy type processing), so a value edited by hand into the wrong type
(text in a number column, a NULL where the schema forbids one, JSON that does not parse or has the wrong
shape) is named as such instead of failing somewhere later with a traceback.
"""

from __future__ import annotations

import json
import math

from sqlalchemy import Connection, Double, Integer, String, Table, inspect
from walla.market import db

TABLES = (db.agents, db.rounds, db.reports, db.resolutions, db.payouts, db.events)
ORDER = {"events": "id", "payouts": "id", "resolutions": "round_id, seq"}


def _numbers(v) -> bool:
    return isinstance(v, list) and all(_number(x) for x in v)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# the JSON columns: what each must parse to
JSON = {
    ("rounds", "options"): (
        "a JSON list of strings",
        lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    ),
    ("reports", "probabilities"): ("a JSON list of finite numbers", _numbers),
    ("resolutions", "target"): ("a JSON list of finite numbers", _numbers),
    ("events", "data"): ("a JSON object", lambda v: isinstance(v, dict)),
}


def where(table: str, row) -> str:
    """`table: row id 5` (or `resolutions: round 3 seq 1`): how the audit names a row."""
    if table == "resolutions":
        return f"resolutions: round {row.round_id} seq {row.seq}"
    return f"{table}: row id {row.id}"


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def check_value(table: Table, row, col) -> str | None:
    """None when the column's stored value has the schema's type (and JSON shape), else one line."""
    v = getattr(row, col.name)
    at = f"{where(table.name, row)} column {col.name}"
    if v is None:
        return None if col.nullable and not col.primary_key else f"{at}: is NULL, expected a value"
    if isinstance(col.type, Integer):
        ok, expected = isinstance(v, int) and not isinstance(v, bool), "an integer"
    elif isinstance(col.type, Double):
        ok, expected = _number(v), "a finite number"
    elif isinstance(col.type, String):
        ok, expected = isinstance(v, str), "text"
    else:
        raise AssertionError(f"{table.name}.{col.name}: a column type the audit does not check")
    if not ok:
        return f"{at}: {_short(v)} is not {expected}"
    if (table.name, col.name) in JSON:
        expected, fits = JSON[(table.name, col.name)]
        try:
            parsed = json.loads(v)
        except ValueError:
            return f"{at}: {_short(v)} is not {expected} (not JSON)"
        except RecursionError:  # JSON nested deeper than the parser's stack (issue 47, item 5)
            return f"{at}: {_short(v)} is not {expected} (nested too deeply to parse)"
        if not fits(parsed):
            return f"{at}: {_short(v)} is not {expected}"
    return None


def read_rows(conn: Connection) -> tuple[dict[str, list], str | None]:
    """Every row of every ledger table, raw; and the first malformed value as one line (None: all well-typed)."""
    out: dict[str, list] = {}
    have = {t.name: {c["name"] for c in inspect(conn).get_columns(t.name)} for t in TABLES}
    for t in TABLES:  # a column added later (db.LATER_COLUMNS) reads as NULL in a ledger that lacks it
        cols = ", ".join(c.name if c.name in have[t.name] else f"NULL AS {c.name}" for c in t.columns)
        order = f" ORDER BY {ORDER.get(t.name, 'id')}"
        out[t.name] = list(conn.exec_driver_sql(f"SELECT {cols} FROM {t.name}{order}"))
    for t in TABLES:
        for row in out[t.name]:
            for col in t.columns:
                problem = check_value(t, row, col)
                if problem is not None:
                    return out, problem
    return out, None
