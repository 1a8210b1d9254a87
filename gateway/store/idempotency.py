"""Store operations of the idempotency table: one row per (calling key, Idempotency-Key).

A row is written as a claim (state ``running``) in the transaction of its call's
pending request row, and given its outcome (or dropped) in the transaction of the
call's settlement (:mod:`gateway.store.records`).
"""

from __future__ import annotations

from typing import Any

from gateway.store import sql as sq
from gateway.store.sql import Conn

#: how long an outcome is kept (DESIGN.md: 24 hours); start-up purges older rows
RETENTION_S = 24 * 3600


def get(conn: Conn, key_id: str, idem_key: str) -> dict[str, Any] | None:
    return sq.select_one(
        conn, "idempotency", "WHERE key_id = ? AND idem_key = ?", (key_id, idem_key)
    )


def put(conn: Conn, row: dict[str, Any]) -> None:
    """Insert or replace (an expired row under the same key is simply overwritten)."""
    sq.upsert(conn, "idempotency", row)


def purge(conn: Conn, before: float) -> int:
    """Drop rows created before ``before``; returns how many."""
    return conn.execute("DELETE FROM idempotency WHERE created_at < ?", (before,)).rowcount


#: a claimed key whose call is in flight; what recovery makes of one whose process is gone
RUNNING, INTERRUPTED = "running", "interrupted"


def settle(conn: Conn, key_id: str, idem_key: str, outcome: dict[str, Any] | None) -> None:
    """The outcome of a claim: its row updated with ``outcome``, or dropped (None)."""
    if outcome is None:
        conn.execute(
            "DELETE FROM idempotency WHERE key_id = ? AND idem_key = ?", (key_id, idem_key)
        )
    else:
        sq.update(conn, "idempotency", {"key_id": key_id, "idem_key": idem_key}, outcome)


def interrupt_running(conn: Conn, requests: str = "", params: tuple[Any, ...] = ()) -> None:
    """Recovery: every claim whose call was in flight when its process died (or only
    those of the request ids the query ``requests`` selects)."""
    where = f" AND request_id IN ({requests})" if requests else ""
    conn.execute(
        f"UPDATE idempotency SET state = ? WHERE state = ?{where}", (INTERRUPTED, RUNNING, *params)
    )
