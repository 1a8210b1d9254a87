"""Store operations of spend-alert webhooks: endpoints and the event outbox."""

from __future__ import annotations

import sqlite3
from typing import Any

from gateway.store import sqlite as sq


def set_webhook(conn: sqlite3.Connection, row: dict[str, Any]) -> None:
    sq.upsert(conn, "webhooks", row)


def all_webhooks(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    return sq.select(conn, "webhooks")


def add_event(conn: sqlite3.Connection, row: dict[str, Any]) -> bool:
    """Queue an event once: a second event with the same id is ignored (False)."""
    columns = ", ".join(row)
    marks = ", ".join("?" for _ in row)
    cursor = conn.execute(
        f"INSERT OR IGNORE INTO webhook_events ({columns}) VALUES ({marks})", tuple(row.values())
    )
    return cursor.rowcount == 1


def event_ids_since(conn: sqlite3.Connection, since: float) -> list[str]:
    rows = conn.execute("SELECT id FROM webhook_events WHERE created_at >= ?", (since,))
    return [row[0] for row in rows.fetchall()]


def due_events(conn: sqlite3.Connection, now: float, limit: int) -> list[dict[str, Any]]:
    """Events not yet delivered nor given up whose next attempt is due, with their endpoint."""
    return sq.query(
        conn,
        "SELECT e.id, e.org_id, e.payload, e.attempts, w.url, w.secret FROM webhook_events e"
        " JOIN webhooks w ON w.org_id = e.org_id"
        " WHERE e.delivered_at IS NULL AND e.given_up = 0 AND e.next_attempt_at <= ?"
        " ORDER BY e.next_attempt_at LIMIT ?",
        (now, limit),
    )


def undelivered_count(conn: sqlite3.Connection) -> int:
    """Events neither delivered nor given up: due now, or waiting for a retry."""
    row = conn.execute(
        "SELECT COUNT(*) FROM webhook_events WHERE delivered_at IS NULL AND given_up = 0"
    ).fetchone()
    return int(row[0])


def mark_delivered(conn: sqlite3.Connection, event_id: str, at: float) -> None:
    conn.execute("UPDATE webhook_events SET delivered_at = ? WHERE id = ?", (at, event_id))


def mark_failed(
    conn: sqlite3.Connection,
    event_id: str,
    attempts: int,
    next_at: float,
    error: str,
    give_up: bool,
) -> None:
    conn.execute(
        "UPDATE webhook_events SET attempts = ?, next_attempt_at = ?, last_error = ?,"
        " given_up = ? WHERE id = ?",
        (attempts, next_at, error[:500], int(give_up), event_id),
    )


def credit_totals(conn: sqlite3.Connection, org_id: str) -> tuple[int, int]:
    """Nano-USD of credits ever added to an organisation, and ever debited from it."""
    row = conn.execute(
        "SELECT COALESCE(SUM(CASE WHEN amount_nanos > 0 THEN amount_nanos END), 0),"
        " -COALESCE(SUM(CASE WHEN amount_nanos < 0 THEN amount_nanos END), 0)"
        " FROM credit_ledger WHERE org_id = ?",
        (org_id,),
    ).fetchone()
    return int(row[0]), int(row[1])
