"""The ledger's schema and engine: SQLAlchemy Core, one code path for SQLite and PostgreSQL.

    engine = make_engine("market.db")                              # SQLite, WAL journal
    engine = make_engine("postgresql+psycopg://u@127.0.0.1:5432/m")  # PostgreSQL (psycopg 3)

SQLite: WAL journal (readers never block the writer), synchronous=NORMAL (a commit survives the process
being killed; only an OS crash or power loss may drop the last commits, never half of one), foreign keys on,
and write transactions start with BEGIN IMMEDIATE (they take the write lock first instead of upgrading a
read lock, which would deadlock two concurrent writers into SQLITE_BUSY). PostgreSQL: READ COMMITTED with
row locks (ledger/ takes the round's row FOR UPDATE to resolve and FOR SHARE to submit a report, and the
agent's row FOR UPDATE to submit: its limit checks run one at a time).

Floats are DOUBLE PRECISION; probability vectors are JSON text written with Python's repr (round-trips
every float exactly). Tables: agents, rounds, reports (one current report per agent and round),
resolutions (per round: the first, then corrections or a
void; (round_id, seq) is the key that makes each happen once), payouts (append-only: a pay row per report
and entry; a correction or void adds reversing rows) and events (the hash-chained log of every write,
every report submission and replacement included, with its time).
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import (
    Column,
    Double,
    Engine,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    func,
    inspect,
    text,
)
from sqlalchemy.schema import CreateIndex

BUSY_TIMEOUT_S = 30.0  # SQLite: how long a writer waits for the lock before failing
WRITE = {"walla_write": True}  # execution option marking a connection that will write

metadata = MetaData()

agents = Table(
    "agents",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(64), nullable=False, unique=True),
    Column("token_hash", String(64), nullable=False, unique=True),  # sha256 hex; the token is never stored
    Column("role", String(16), nullable=False),  # agent | operator
    Column("created_at", Double, nullable=False),
    Column("max_wager", Double),  # the largest wager this agent may stake on one round (None: MAX_WAGER)
    Column("floor", Double),  # its balance may not fall below this in the worst case (None: no floor)
    Column("revoked_at", Double),  # a revoked agent's token is refused; its rows stay
)
# names are unique case-folded: `ALICE` is refused beside `alice` (names are ASCII, so lower() = casefold())
Index("agents_name_folded", func.lower(agents.c.name), unique=True)

rounds = Table(
    "rounds",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("question", Text, nullable=False),
    Column("options", Text, nullable=False),  # JSON list of strings
    Column("n_options", Integer, nullable=False),
    Column("variant", String(4), nullable=False),
    Column("c1", Double, nullable=False),
    Column("c2", Double, nullable=False),
    Column("c3", Double, nullable=False),
    Column("pooling", String(8), nullable=False),
    Column("status", String(10), nullable=False, index=True),  # open | closed | resolved
    Column("close_at", Double),  # unix seconds; submissions after it are refused
    Column("created_at", Double, nullable=False),
    Column("closed_at", Double),
    Column(
        "publish_pool", String(12), nullable=False
    ),  # never | close | resolution: when agents see the pool
    Column("max_wager", Double),  # the largest wager a report of this round may stake (None: MAX_WAGER)
    Column("criteria", Text),  # how the answer will be decided
    Column("source", Text),  # where it will come from
    Column(
        "walla_version", String(32), nullable=False
    ),  # the walla that opened it (mechanism settings above)
)

reports = Table(
    "reports",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("round_id", Integer, ForeignKey("rounds.id"), nullable=False),
    Column("agent_id", Integer, ForeignKey("agents.id"), nullable=False),
    Column("probabilities", Text, nullable=False),  # JSON list of K floats, as submitted
    Column("wager", Double, nullable=False),
    Column("version", Integer, nullable=False),  # 1 + number of replacements
    Column("submitted_at", Double, nullable=False),
    UniqueConstraint("round_id", "agent_id", name="one_report_per_agent"),
)

resolutions = Table(  # append-only: a round's first resolution, then each correction or its voiding
    "resolutions",
    metadata,
    Column("round_id", Integer, ForeignKey("rounds.id"), primary_key=True, autoincrement=False),
    Column("seq", Integer, primary_key=True, autoincrement=False),  # 1 = the resolution; 2.. = corrections
    Column("kind", String(8), nullable=False),  # resolve | correct | void
    Column("label", Integer),  # the answer as an option index, or null for a gold distribution (or a void)
    Column(
        "target", Text, nullable=False
    ),  # JSON [K]: one-hot(label) or the gold distribution; [] for a void
    Column("n_reports", Integer, nullable=False),
    Column("total_payout", Double, nullable=False),  # the round's net outlay under this entry (0 for a void)
    Column("deficit_bound", Double, nullable=False),  # c2^2 / c3
    Column("resolved_at", Double, nullable=False),
    Column("note", Text),  # the operator's note at resolution; a void's reason
)

payouts = Table(  # append-only: a correction or a void reverses the paid rows with new rows, never an edit
    "payouts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("round_id", Integer, ForeignKey("rounds.id"), nullable=False, index=True),
    Column("seq", Integer, nullable=False),  # the resolutions entry it belongs to
    Column("kind", String(8), nullable=False),  # pay | reverse (of the previous entry's pay row)
    Column("agent_id", Integer, ForeignKey("agents.id"), nullable=False, index=True),
    Column("report_id", Integer, ForeignKey("reports.id"), nullable=False),
    Column("wager", Double, nullable=False),
    Column("score", Double, nullable=False),
    Column("baseline", Double, nullable=False),
    Column("advantage", Double, nullable=False),
    Column("payout", Double, nullable=False),
    ForeignKeyConstraint(["round_id", "seq"], ["resolutions.round_id", "resolutions.seq"]),
    UniqueConstraint("round_id", "seq", "agent_id", "kind", name="one_payout_per_agent_and_entry"),
)

events = Table(  # append-only, hash-chained: hash = sha256(prev_hash + canonical JSON of the entry)
    "events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),  # 1, 2, ...: the chain's order
    Column("at", Double, nullable=False),
    Column("kind", String(24), nullable=False),
    Column("round_id", Integer, index=True),  # a resolution reads its round's round_opened event
    Column("agent_id", Integer),
    Column("data", Text, nullable=False),  # canonical JSON (sorted keys, floats as repr)
    Column("prev_hash", String(64), nullable=False),
    Column("hash", String(64), nullable=False, unique=True),
    Column("mac", String(64)),  # HMAC of hash under the market's key (_keys.py); NULL: written unsigned
)
# columns added after ledgers were in use, nullable: added to such a ledger when a writer opens it, and read
# as NULL by the audit (which never writes) until then
LATER_COLUMNS = {("events", "mac")}

SCHEMES = ("sqlite", "postgresql", "postgres", "postgresql+psycopg")  # the databases the ledger supports


def database_url(db: str | Path) -> str:
    """A path (SQLite file) or a SQLAlchemy URL; `postgresql://` means psycopg 3.

    Raises:
        ValueError: a URL of a database the ledger does not support (e.g. mysql://), naming the ones it does.
    """
    text = str(db)
    if "://" not in text:
        return f"sqlite:///{Path(text).expanduser().resolve()}"
    scheme = text.split("://", 1)[0]
    if scheme not in SCHEMES:
        raise ValueError(
            f"{scheme}:// is not a supported database (expected a SQLite file path, sqlite:///PATH or "
            "postgresql://USER@HOST/DB)"
        )
    if scheme in ("postgresql", "postgres"):
        return "postgresql+psycopg://" + text.split("://", 1)[1]
    return text


def _create_private(url: str) -> None:
    """Create a new SQLite file readable by its owner only (0600): it holds the market's money and token hashes."""
    path = url.split(":///", 1)[1] if ":///" in url else ""
    if path and not path.startswith(":memory:") and not os.path.exists(path):
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))


def _sqlite_events(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn, _record) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (pysqlite's own BEGIN is deferred)
        cur = dbapi_conn.cursor()
        for pragma in (
            "journal_mode=WAL",
            "synchronous=NORMAL",
            "foreign_keys=ON",
            f"busy_timeout={int(BUSY_TIMEOUT_S * 1000)}",
        ):
            cur.execute(f"PRAGMA {pragma}")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn) -> None:
        conn.exec_driver_sql(
            "BEGIN IMMEDIATE" if conn.get_execution_options().get("walla_write") else "BEGIN"
        )


def make_engine(db: str | Path, create: bool = True) -> Engine:
    """An engine on the ledger at `db` (path or URL), its tables and indexes created if missing."""
    url = database_url(db)
    if url.startswith("sqlite"):
        _create_private(url)
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT_S},
            pool_size=16,
            max_overflow=48,
        )
        _sqlite_events(engine)
    else:
        engine = create_engine(
            url, pool_size=16, max_overflow=48
        )  # no pre-ping: it doubled the round trips; a dropped connection fails one transaction, which _write retries
    if create:
        metadata.create_all(engine)
        _add_later_columns(engine)
        _check_schema(engine)
        _add_missing_indexes(engine)
    return engine


def _add_missing_indexes(engine: Engine) -> None:
    """Create the indexes an existing ledger lacks: create_all makes a table's indexes only with the table,
    so an index added to walla later (events.round_id's) never reached the ledgers made before it.

    The names come from the database's catalog (SQLAlchemy's SQLite reflection skips expression indexes),
    and only a missing one is created (PostgreSQL's CREATE INDEX locks the table even when the index exists);
    IF NOT EXISTS covers another process adding the same index meanwhile."""
    if engine.dialect.name == "sqlite":
        q = "SELECT name FROM sqlite_master WHERE type = 'index'"
    else:
        q = "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()"
    with engine.begin() as conn:
        have = set(conn.execute(text(q)).scalars())
        for table in metadata.sorted_tables:
            for index in table.indexes:
                if index.name not in have:
                    conn.execute(CreateIndex(index, if_not_exists=True))


def _add_later_columns(engine: Engine) -> None:
    """Add LATER_COLUMNS to a ledger made before them (NULL in its old rows: events.mac, unsigned)."""
    found = inspect(engine)
    for table, column in sorted(LATER_COLUMNS):
        if column not in {c["name"] for c in found.get_columns(table)}:
            col = metadata.tables[table].c[column]
            kind = col.type.compile(dialect=engine.dialect)
            with engine.begin() as conn:
                conn.execute(text(f"ALTER TABLE {table} ADD COLUMN {column} {kind}"))


def _check_schema(engine: Engine) -> None:
    """Refuse a ledger whose tables lack this walla's columns (made by an older walla: no migrations yet)."""
    found = inspect(engine)
    for table in metadata.sorted_tables:
        have = {c["name"] for c in found.get_columns(table.name)}
        missing = [c.name for c in table.columns if c.name not in have]
        if missing:
            engine.dispose()
            raise ValueError(
                f"table {table.name} lacks column {missing[0]}: the ledger was made by an older walla "
                "(`walla market export` it with that version and start a new ledger)"
            )
