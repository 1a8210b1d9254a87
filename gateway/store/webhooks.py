"""Store operations of spend-alert webhooks: endpoints and the event outbox."""

from __future__ import annotations

from typing import Any

from gateway.store import sql as sq
from gateway.store.sql import Conn


def set_webhook(conn: Conn, row: dict[str, Any]) -> None:
    sq.upsert(conn, "webhooks", row)


def all_webhooks(conn: Conn) -> list[dict[str, Any]]:
    return sq.select(conn, "webhooks")


def add_event(conn: Conn, row: dict[str, Any]) -> bool:
    """Queue an event once: a second event with the same id is ignored (False)."""
    return sq.insert_new(conn, "webhook_events", row)


def event_ids_since(conn: Conn, since: float) -> list[str]:
    rows = sq.query(conn, "SELECT id FROM webhook_events WHERE created_at >= ?", (since,))
    return [row["id"] for row in rows]


def due_events(conn: Conn, now: float, limit: int) -> list[dict[str, Any]]:
    """Events not yet delivered nor given up whose next attempt is due, with their endpoint."""
    return sq.query(
        conn,
        "SELECT e.id, e.org_id, e.payload, e.attempts, w.url, w.secret FROM webhook_events e"
        " JOIN webhooks w ON w.org_id = e.org_id"
        " WHERE e.delivered_at IS NULL AND e.given_up = 0 AND e.next_attempt_at <= ?"
        " ORDER BY e.next_attempt_at LIMIT ?",
        (now, limit),
    )


def undelivered_count(conn: Conn) -> int:
    """Events neither delivered nor given up: due now, or waiting for a retry."""
    row = sq.query(
        conn,
        "SELECT COUNT(*) AS n FROM webhook_events WHERE delivered_at IS NULL AND given_up = 0",
    )[0]
    return int(row["n"])


def mark_delivered(conn: Conn, event_id: str, at: float) -> None:
    conn.execute("UPDATE webhook_events SET delivered_at = ? WHERE id = ?", (at, event_id))


def mark_failed(
    conn: Conn,
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


def credit_totals(conn: Conn, org_id: str) -> tuple[int, int]:
    """Nano-USD of credits ever added to an organisation, and ever debited from it."""
    row = sq.query(
        conn,
        "SELECT COALESCE(SUM(CASE WHEN amount_nanos > 0 THEN amount_nanos END), 0) AS added,"
        " -COALESCE(SUM(CASE WHEN amount_nanos < 0 THEN amount_nanos END), 0) AS debited"
        " FROM credit_ledger WHERE org_id = ?",
        (org_id,),
    )[0]
    return int(row["added"]), int(row["debited"])
