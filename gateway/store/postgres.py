"""The PostgreSQL backend (psycopg 3, synchronous, on the store's worker threads).

- ``?`` placeholders become psycopg's ``%s``; rows are dicts; a JSONB column is read as
  its text and a ``SUM`` of BIGINTs (NUMERIC in PostgreSQL) as an int, so the portable
  operations of :mod:`gateway.store.sql` see what SQLite gives them.
- Any number of servers (nodes) may share the database: each registers itself and leases
  its share of every shared limit (:mod:`gateway.store.node_leases`).
- Migrations run under an advisory lock, so two processes starting at once
  cannot both migrate.
- A batch notes its transaction id: when the connection is lost during COMMIT, the
  writer asks the database, once back, whether that transaction committed.
"""

from __future__ import annotations

import functools
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg.adapt import Loader
from psycopg.rows import dict_row

from gateway.store.migrations import migrate_postgres
from gateway.store.sql import Conn, Dialect
from gateway.store.store_error import StoreError

#: advisory lock keys (two int4): "SVGW" and what is locked
_LOCK_CLASS = 0x53564757
_MIGRATION_LOCK = 2
CONNECT_TIMEOUT_S = 3
#: SQLSTATEs of a transaction that lost a conflict: serialization_failure,
#: deadlock_detected, lock_not_available
_RETRYABLE = frozenset({"40001", "40P01", "55P03"})

DIALECT = Dialect(
    name="postgresql",
    json_text=lambda column: f"({column} ->> ?::text)",
    json_int=lambda column, member: f"({column} ->> '{member}')::bigint",
    bytewise=lambda expression: f'{expression} COLLATE "C"',
)


def display_name(url: str) -> str:
    """The URL without its password (it is never printed nor logged)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit(parts._replace(netloc=user + netloc))


class _JsonAsText(Loader):
    def load(self, data: Any) -> str:
        return bytes(data).decode()


class _SumAsInt(Loader):
    """NUMERIC comes only from SUMs of BIGINT columns here: an int when it is whole."""

    def load(self, data: Any) -> int | Decimal:
        value = Decimal(bytes(data).decode())
        return int(value) if value == value.to_integral_value() else value


@functools.lru_cache(maxsize=1024)
def _translate(sql: str) -> str:
    return sql.replace("%", "%%").replace("?", "%s")


def _wrap(raw: psycopg.Connection[Any]) -> Conn:
    execute = raw.execute

    def run(sql: str, params: tuple[Any, ...] = ()) -> Any:
        return execute(_translate(sql), params)

    return Conn(raw, DIALECT, run)


class PostgresBackend:
    """One PostgreSQL database named by a URL (password from it or ``PGPASSWORD``)."""

    errors: tuple[type[BaseException], ...] = (psycopg.Error,)

    def __init__(self, url: str) -> None:
        self.url = url
        self.name = display_name(url)

    def _connect(self) -> Conn:
        try:
            raw = psycopg.connect(
                self.url,
                autocommit=True,
                row_factory=dict_row,
                connect_timeout=CONNECT_TIMEOUT_S,
                application_name="svc-gateway",
            )
        except psycopg.Error as exc:
            reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            raise StoreError(f"cannot reach the database {self.name}: {reason}") from None
        raw.adapters.register_loader("jsonb", _JsonAsText)
        raw.adapters.register_loader("numeric", _SumAsInt)
        return _wrap(raw)

    def open_writer(self) -> Conn:
        conn = self._connect()
        try:
            conn.execute("SELECT pg_advisory_lock(?, ?)", (_LOCK_CLASS, _MIGRATION_LOCK))
            try:
                migrate_postgres(conn)
            finally:
                conn.execute("SELECT pg_advisory_unlock(?, ?)", (_LOCK_CLASS, _MIGRATION_LOCK))
        except psycopg.Error as exc:
            conn.raw.close()
            raise StoreError(f"cannot use the database {self.name}: {exc}") from None
        return conn

    def reconnect_writer(self) -> Conn:
        return self._connect()

    def open_reader(self) -> Conn:
        return self._connect()

    open_transactions = open_reader

    def begin(self, conn: Conn) -> str:
        """Open the batch's transaction; returns its id (see :meth:`committed`)."""
        cursor = conn.raw.execute("BEGIN; SELECT pg_current_xact_id()::text AS xid")
        cursor.nextset()  # one round trip, two results: BEGIN's, then the id
        row = cursor.fetchone()
        assert row is not None
        return str(row["xid"])

    def begin_at_once(self, conn: Conn) -> bool:
        """Never: a transaction on a database server is a round trip, and the serving
        thread does not wait for one (every write goes through the writer's thread)."""
        return False

    def in_transaction(self, conn: Conn) -> bool:
        status: psycopg.pq.TransactionStatus = conn.raw.info.transaction_status
        return status != psycopg.pq.TransactionStatus.IDLE

    def lost(self, conn: Conn, exc: BaseException) -> bool:
        """The connection is gone (the server stopped, restarted, or cannot be reached)."""
        return bool(conn.raw.closed)  # a fatal error (57P01 on a stop...) closes it

    def retryable(self, exc: BaseException) -> bool:
        """A conflict with another transaction (a deadlock, a serialization failure, a
        lock not available): the same work succeeds when run again."""
        return getattr(exc, "sqlstate", None) in _RETRYABLE

    def committed(self, conn: Conn, token: object) -> bool:
        """On a new connection: did the transaction ``token`` of a lost one commit?"""
        row = conn.execute("SELECT pg_xact_status(?::xid8) AS status", (token,)).fetchall()[0]
        status: str = row["status"]
        return status == "committed"

    def tables(self, conn: Conn) -> list[str]:
        rows = conn.execute(
            "SELECT table_name AS name FROM information_schema.tables"
            " WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'",
            (),
        )
        return [row["name"] for row in rows.fetchall()]

    def after_copy(self, conn: Conn, table: str) -> None:
        """Rows copied with their ids: an identity column must go on after the largest."""
        identities = conn.execute(
            "SELECT column_name AS name FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND table_name = ? AND is_identity = 'YES'",
            (table,),
        ).fetchall()
        for column in (row["name"] for row in identities):
            conn.execute(
                f"SELECT setval(pg_get_serial_sequence(?, ?), COALESCE(MAX({column}), 0) + 1,"
                f" false) FROM {table}",
                (table, column),
            )

    def close(self, conn: Conn) -> None:
        conn.raw.close()
