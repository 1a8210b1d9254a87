"""Store operations of the idempotency table: one row per (calling key, Idempotency-Key)."""

from __future__ import annotations

import sqlite3
from typing import Any

from gateway.store import sqlite as sq

#: how long an outcome is kept (DESIGN.md: 24 hours); start-up purges older rows
RETENTION_S = 24 * 3600


def get(conn: sqlite3.Connection, key_id: str, idem_key: str) -> dict[str, Any] | None:
    return sq.select_one(
        conn, "idempotency", "WHERE key_id = ? AND idem_key = ?", (key_id, idem_key)
    )


def put(conn: sqlite3.Connection, row: dict[str, Any]) -> None:
    """Insert or replace (an expired row under the same key is simply overwritten)."""
    sq.upsert(conn, "idempotency", row)


def purge(conn: sqlite3.Connection, before: float) -> int:
    """Drop rows created before ``before``; returns how many."""
    return conn.execute("DELETE FROM idempotency WHERE created_at < ?", (before,)).rowcount
