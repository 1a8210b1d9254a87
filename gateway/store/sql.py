"""Portable SQL: one connection type for both backends, and the row-level operations on it.

The store's operations (:mod:`gateway.store.records`, ``idempotency``, ``webhooks``) are
written once, against :class:`Conn`: ``?`` placeholders, rows as dicts, upserts as
``ON CONFLICT`` (both dialects speak it), and the few expressions the two spell
differently (a member of a JSON column, a byte-wise text order) asked of the
connection's :class:`Dialect`. The backends (:mod:`gateway.store.sqlite`,
:mod:`gateway.store.postgres`) build a :class:`Conn` over their driver's connection.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import orjson

F = TypeVar("F", bound=Callable[..., Any])

JSON_COLUMNS = {
    "keys": (
        "scopes",
        "caps",
        "allowed_models",
        "required_tags",
        "default_tags",
        "guardrails",
        "allowed_tools",
    ),
    "orgs": ("policy",),
    "requests": ("tags", "usage", "attempts", "guardrails"),
    "idempotency": ("headers",),
}

#: each table's primary key: what an upsert conflicts on
PRIMARY_KEYS = {
    "orgs": ("id",),
    "keys": ("id",),
    "provider_credentials": ("org_id", "provider"),
    "requests": ("id",),
    "idempotency": ("key_id", "idem_key"),
    "credit_ledger": ("id",),
    "webhooks": ("org_id",),
    "webhook_events": ("id",),
    "dashboard_users": ("id",),
    "dashboard_sessions": ("id",),
    "dashboard_secrets": ("name",),
    "model_switches": ("model_id",),
}


#: the places of row locks in a batch (:class:`gateway.store.Store` sorts each batch by
#: them): key rows, organisation rows, Idempotency-Key claims, then the rows a call owns
#: (its request row, its node's leases) and new rows; within a place, by the rows' ids.
#: Every node takes its locks in this order, so two batches cannot wait on each other.
KEY_ROWS, ORG_ROWS, CLAIMS, OWN_ROWS = range(4)
#: operation → its place, from the operation's arguments after the connection
LOCK_ORDER: dict[Callable[..., Any], Callable[..., tuple[Any, ...]]] = {}


def locks(place: Callable[..., tuple[Any, ...]]) -> Callable[[F], F]:
    """Declare where an operation's row locks stand in a batch (undeclared: OWN_ROWS)."""

    def declare(op: F) -> F:
        LOCK_ORDER[op] = place
        return op

    return declare


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchall(self) -> list[Any]: ...


@dataclass(frozen=True, slots=True)
class Dialect:
    """What differs between SQLite and PostgreSQL in the statements of the operations."""

    name: str
    #: the text of a top-level member of a JSON column: ``json_text(column)`` with the
    #: member's name as the next ``?`` parameter
    json_text: Callable[[str], str]
    #: an integer member of a JSON column named by a literal
    json_int: Callable[[str, str], str]
    #: a text expression ordered byte-wise (SQLite's order; PostgreSQL's collation may differ)
    bytewise: Callable[[str], str]


class Conn:
    """A driver connection seen the same way by every operation.

    ``execute(sql, params)`` takes ``?`` placeholders and returns a cursor whose rows are
    mappings (``dict(row)`` works on both backends).
    """

    __slots__ = ("dialect", "execute", "raw")

    def __init__(
        self, raw: Any, dialect: Dialect, execute: Callable[[str, tuple[Any, ...]], Cursor]
    ) -> None:
        self.raw = raw
        self.dialect = dialect
        self.execute = execute


def encode(table: str, row: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(row)
    for column in JSON_COLUMNS.get(table, ()):
        if column in out and out[column] is not None:
            out[column] = orjson.dumps(out[column]).decode()
    return out


def decode(table: str, row: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(row)
    for column in JSON_COLUMNS.get(table, ()):
        if out.get(column) is not None:
            out[column] = orjson.loads(out[column])
    return out


def _insert_sql(table: str, columns: Iterable[str], tail: str = "") -> str:
    names = list(columns)
    marks = ", ".join("?" for _ in names)
    return f"INSERT INTO {table} ({', '.join(names)}) VALUES ({marks}){tail}"


def insert(conn: Conn, table: str, row: Mapping[str, Any]) -> None:
    data = encode(table, row)
    conn.execute(_insert_sql(table, data), tuple(data.values()))


def upsert(conn: Conn, table: str, row: Mapping[str, Any]) -> None:
    """Insert, or replace the row with the same primary key."""
    data = encode(table, row)
    keys = PRIMARY_KEYS[table]
    sets = ", ".join(f"{column} = excluded.{column}" for column in data if column not in keys)
    tail = f" ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {sets}"
    conn.execute(_insert_sql(table, data, tail), tuple(data.values()))


def insert_new(conn: Conn, table: str, row: Mapping[str, Any]) -> bool:
    """Insert unless a row with the same primary key exists; True when inserted."""
    data = encode(table, row)
    cursor = conn.execute(_insert_sql(table, data, " ON CONFLICT DO NOTHING"), tuple(data.values()))
    return cursor.rowcount == 1


def update(conn: Conn, table: str, where: Mapping[str, Any], values: Mapping[str, Any]) -> int:
    data = encode(table, values)
    sets = ", ".join(f"{column} = ?" for column in data)
    conds = " AND ".join(f"{column} = ?" for column in where)
    cursor = conn.execute(
        f"UPDATE {table} SET {sets} WHERE {conds}", (*data.values(), *where.values())
    )
    return cursor.rowcount


def select(
    conn: Conn, table: str, sql: str = "", params: Iterable[Any] = ()
) -> list[dict[str, Any]]:
    rows = conn.execute(f"SELECT * FROM {table} {sql}", tuple(params)).fetchall()
    return [decode(table, row) for row in rows]


def select_one(
    conn: Conn, table: str, sql: str, params: Iterable[Any] = ()
) -> dict[str, Any] | None:
    rows = select(conn, table, sql + " LIMIT 1", params)
    return rows[0] if rows else None


def query(conn: Conn, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
    return [dict(row) for row in conn.execute(sql, tuple(params)).fetchall()]
