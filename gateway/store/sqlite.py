"""The SQLite backend: opening a database file safely, its dialect, its transactions.

With :mod:`gateway.store.postgres`, the only importer of a database driver in the project.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from sqlite_utils import Database

from gateway.store.migrations import migrate
from gateway.store.sql import Conn, Dialect
from gateway.store.store_error import StoreError

#: how long a writer waits for the file's write lock (another process's transaction)
LOCK_WAIT_S = 5.0
#: the pauses between tries for the write lock, doubling from the first to the last:
#: another worker's batch holds it for a millisecond or two. (SQLite's own busy handler
#: sleeps 1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, then 100 ms: a writer that met the
#: lock twice slept through several batches of the others, the lock free meanwhile.)
LOCK_PAUSES_S = (0.0002, 0.002)

DIALECT = Dialect(
    name="sqlite",
    json_text=lambda column: f"json_extract({column}, '$.\"' || ? || '\"')",
    json_int=lambda column, member: f"json_extract({column}, '$.{member}')",
    bytewise=lambda expression: expression,
)


def _wrap(raw: sqlite3.Connection) -> Conn:
    raw.row_factory = sqlite3.Row
    return Conn(raw, DIALECT, raw.execute)


def connect(path: str) -> Conn:
    """Open (creating if needed) the database at ``path`` in WAL mode, migrated.

    Refuses a missing parent directory and a file that is not SQLite without
    touching it.
    """
    if path != ":memory:":
        file = Path(path)
        if not file.parent.exists():
            raise StoreError(f"database directory does not exist: {file.parent}")
        if file.is_dir():
            raise StoreError(f"database path is a directory: {file}")
        if file.exists() and file.stat().st_size > 0:
            with file.open("rb") as handle:
                if handle.read(16) != b"SQLite format 3\x00":
                    raise StoreError(f"not an SQLite database: {file}")
    try:
        raw = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        raw.execute("PRAGMA journal_mode=WAL")
        raw.execute("PRAGMA synchronous=FULL")
        raw.execute("PRAGMA busy_timeout=5000")
        raw.execute("PRAGMA foreign_keys=ON")
        migrate(Database(raw))
        raw.execute("PRAGMA busy_timeout=0")  # begin() waits for the write lock itself
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"cannot use database {path}: {exc}") from None
    return _wrap(raw)


class SqliteBackend:
    """One database file: a writer connection (migrated at open) and a reader."""

    errors: tuple[type[BaseException], ...] = (sqlite3.Error,)

    def __init__(self, path: str) -> None:
        self.path = path
        self.name = path if path == ":memory:" else str(Path(path).resolve())

    def open_writer(self) -> Conn:
        return connect(self.path)

    reconnect_writer = open_writer

    def open_reader(self) -> Conn:
        raw = sqlite3.connect(
            self.path if self.path != ":memory:" else "file::memory:",
            check_same_thread=False,
            isolation_level=None,
        )
        return _wrap(raw)

    def open_transactions(self) -> Conn:
        """The connection of :meth:`gateway.store.Store.transact` (a lease refill): only
        write transactions, so it waits for the write lock as the writer does
        (:meth:`begin`), not in SQLite's handler."""
        conn = self.open_reader()
        conn.execute("PRAGMA busy_timeout=0", ())
        return conn

    def begin(self, conn: Conn) -> None:
        """``BEGIN IMMEDIATE``: the file's write lock, tried again after short pauses
        while another process (a worker of ``serve --workers``) holds it, for up to
        :data:`LOCK_WAIT_S`; then "database is locked" (:meth:`retryable`). The writer's
        and the transactions' connections have no busy timeout of their own; the
        reader keeps SQLite's (a read must not fail on a brief lock)."""
        if self.begin_at_once(conn):
            return
        raw = conn.raw
        deadline = time.monotonic() + LOCK_WAIT_S
        pause, longest = LOCK_PAUSES_S
        while True:
            time.sleep(pause)
            pause = min(pause * 2, longest)
            try:
                raw.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if not self.retryable(exc) or time.monotonic() > deadline:
                    raise

    def begin_at_once(self, conn: Conn) -> bool:
        """``BEGIN IMMEDIATE`` if the write lock is free now; False (no transaction) if
        another process holds it."""
        try:
            conn.raw.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if not self.retryable(exc):
                raise
            return False
        return True

    def in_transaction(self, conn: Conn) -> bool:
        return bool(conn.raw.in_transaction)

    def lost(self, conn: Conn, exc: BaseException) -> bool:
        """A file does not go away like a server: every error is the batch's own."""
        return False

    def retryable(self, exc: BaseException) -> bool:
        """The file was locked past ``busy_timeout`` (another process held it)."""
        return isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)

    def committed(self, conn: Conn, token: object) -> bool:
        return False

    def tables(self, conn: Conn) -> list[str]:
        rows = conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'", ()
        )
        return [row["name"] for row in rows.fetchall()]

    def after_copy(self, conn: Conn, table: str) -> None:
        """Rows copied with their ids: SQLite's next rowid follows the largest by itself."""

    def close(self, conn: Conn) -> None:
        conn.raw.close()
