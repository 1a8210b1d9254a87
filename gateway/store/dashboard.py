"""Store operations of the organisation dashboard: users, sessions, the signing secret,
and the organisation-wide reads of its pages (request records, the credit ledger)."""

from __future__ import annotations

from typing import Any

from gateway.store import sql as sq
from gateway.store.sql import Conn

# -- users ---------------------------------------------------------------------------------


def insert_user(conn: Conn, row: dict[str, Any]) -> bool:
    """Insert a user; False (nothing written) when the email is taken."""
    return sq.insert_new(conn, "dashboard_users", row)


def get_user(conn: Conn, user_id: str) -> dict[str, Any] | None:
    return sq.select_one(conn, "dashboard_users", "WHERE id = ?", (user_id,))


def user_by_email(conn: Conn, email: str) -> dict[str, Any] | None:
    return sq.select_one(conn, "dashboard_users", "WHERE email = ?", (email,))


def list_users(conn: Conn, org_id: str | None) -> list[dict[str, Any]]:
    if org_id is None:
        return sq.select(conn, "dashboard_users", "ORDER BY created_at, id")
    return sq.select(conn, "dashboard_users", "WHERE org_id = ? ORDER BY created_at, id", (org_id,))


def update_user(
    conn: Conn, user_id: str, values: dict[str, Any], end_sessions: bool = False
) -> int:
    """Change a user; ``end_sessions`` also signs it out everywhere (one transaction)."""
    if end_sessions:
        conn.execute("DELETE FROM dashboard_sessions WHERE user_id = ?", (user_id,))
    return sq.update(conn, "dashboard_users", {"id": user_id}, values)


# -- sessions ------------------------------------------------------------------------------


def insert_session(conn: Conn, row: dict[str, Any], now: float) -> None:
    """A new session (expired ones are purged on the way)."""
    conn.execute("DELETE FROM dashboard_sessions WHERE expires_at <= ?", (now,))
    sq.insert(conn, "dashboard_sessions", row)


def session_user(conn: Conn, session_id: str, now: float) -> dict[str, Any] | None:
    """The active user of a live session, with the session's ``expires_at``."""
    rows = sq.query(
        conn,
        "SELECT u.id, u.org_id, u.email, u.role, u.password_temporary, s.expires_at"
        " FROM dashboard_sessions s"
        " JOIN dashboard_users u ON u.id = s.user_id"
        " WHERE s.id = ? AND s.expires_at > ? AND u.status = 'active'",
        (session_id, now),
    )
    return rows[0] if rows else None


def delete_session(conn: Conn, session_id: str) -> None:
    conn.execute("DELETE FROM dashboard_sessions WHERE id = ?", (session_id,))


def signing_secret(conn: Conn, fresh: str, now: float) -> str:
    """The dashboard's signing secret: ``fresh`` is stored the first time, then kept."""
    row = {"name": "session_signing", "value": fresh, "created_at": now}
    sq.insert_new(conn, "dashboard_secrets", row)
    found = sq.query(conn, "SELECT value FROM dashboard_secrets WHERE name = 'session_signing'")
    return str(found[0]["value"])


# -- organisation-wide reads ---------------------------------------------------------------


def org_requests(
    conn: Conn,
    org_id: str,
    filters: dict[str, str],
    limit: int,
    before: tuple[float, str] | None = None,
    bounds: tuple[float, float] | None = None,
) -> list[dict[str, Any]]:
    """A page of an organisation's request records, newest first (``created``, then
    ``id``): the ``limit`` after ``before``, the ``(created, id)`` of the previous page's
    last row (keyset pages: a deep page costs what the first does).

    ``filters`` may hold ``key_id``, ``model``, ``status`` and ``tag`` (``k`` or ``k=v``);
    ``bounds`` is ``[start, end)`` in epoch seconds. Migration 8's indexes serve each
    equality filter with the page order; a tag is matched on the rows the others leave.
    """
    where = ["org_id = ?"]
    params: list[Any] = [org_id]
    for column in ("key_id", "model", "status"):
        if filters.get(column):
            where.append(f"{column} = ?")
            params.append(filters[column])
    if filters.get("tag"):
        name, sep, value = filters["tag"].partition("=")
        member = conn.dialect.json_text("tags")
        if sep:
            where.append(f"{member} = ?")
            params += [name, value]
        else:
            where.append(f"{member} IS NOT NULL")
            params.append(name)
    if bounds is not None:
        where.append("created >= ? AND created < ?")
        params += list(bounds)
    if before is not None:
        where.append("(created, id) < (?, ?)")
        params += list(before)
    params.append(limit)
    return sq.select(
        conn,
        "requests",
        f"WHERE {' AND '.join(where)} ORDER BY created DESC, id DESC LIMIT ?",
        params,
    )


def org_request(conn: Conn, org_id: str, request_id: str) -> dict[str, Any] | None:
    return sq.select_one(conn, "requests", "WHERE id = ? AND org_id = ?", (request_id, org_id))


def ledger_rows(conn: Conn, org_id: str, limit: int) -> list[dict[str, Any]]:
    """The organisation's credit ledger, newest first."""
    return sq.select(
        conn,
        "credit_ledger",
        "WHERE org_id = ? ORDER BY created_at DESC, id DESC LIMIT ?",
        (org_id, limit),
    )
