"""SQLite access: opening a database safely, and the row-level operations on it.

Every function here is synchronous and takes a :class:`sqlite3.Connection`; the async
:class:`gateway.store.Store` decides on which thread and in which batch they run. This
module and its package are the only importers of sqlite in the project.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson
from sqlite_utils import Database

from gateway.store.migrations import migrate

JSON_COLUMNS = {
    "keys": ("scopes", "caps", "allowed_models", "required_tags", "default_tags"),
    "orgs": ("policy",),
    "requests": ("tags", "usage"),
    "idempotency": ("headers",),
}


class StoreError(Exception):
    """The database cannot be used (missing directory, not SQLite, locked...)."""


def connect(path: str) -> sqlite3.Connection:
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
        conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=5000")
        conn.execute("PRAGMA foreign_keys=ON")
        migrate(Database(conn))
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"cannot use database {path}: {exc}") from None
    return conn


def encode(table: str, row: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(row)
    for column in JSON_COLUMNS.get(table, ()):
        if column in out and out[column] is not None:
            out[column] = orjson.dumps(out[column]).decode()
    return out


def decode(table: str, row: sqlite3.Row | Mapping[str, Any]) -> dict[str, Any]:
    out = dict(row)
    for column in JSON_COLUMNS.get(table, ()):
        if out.get(column) is not None:
            out[column] = orjson.loads(out[column])
    return out


def insert(conn: sqlite3.Connection, table: str, row: Mapping[str, Any]) -> None:
    data = encode(table, row)
    columns = ", ".join(data)
    marks = ", ".join("?" for _ in data)
    conn.execute(f"INSERT INTO {table} ({columns}) VALUES ({marks})", tuple(data.values()))


def upsert(conn: sqlite3.Connection, table: str, row: Mapping[str, Any]) -> None:
    data = encode(table, row)
    columns = ", ".join(data)
    marks = ", ".join("?" for _ in data)
    conn.execute(
        f"INSERT OR REPLACE INTO {table} ({columns}) VALUES ({marks})", tuple(data.values())
    )


def update(
    conn: sqlite3.Connection, table: str, where: Mapping[str, Any], values: Mapping[str, Any]
) -> int:
    data = encode(table, values)
    sets = ", ".join(f"{column} = ?" for column in data)
    conds = " AND ".join(f"{column} = ?" for column in where)
    cursor = conn.execute(
        f"UPDATE {table} SET {sets} WHERE {conds}", (*data.values(), *where.values())
    )
    return cursor.rowcount


def select(
    conn: sqlite3.Connection, table: str, sql: str = "", params: Iterable[Any] = ()
) -> list[dict[str, Any]]:
    rows = conn.execute(f"SELECT * FROM {table} {sql}", tuple(params)).fetchall()
    return [decode(table, row) for row in rows]


def select_one(
    conn: sqlite3.Connection, table: str, sql: str, params: Iterable[Any] = ()
) -> dict[str, Any] | None:
    rows = select(conn, table, sql + " LIMIT 1", params)
    return rows[0] if rows else None


def query(conn: sqlite3.Connection, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
    return [dict(row) for row in conn.execute(sql, tuple(params)).fetchall()]
