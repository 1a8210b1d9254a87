"""Store operations of the dashboard's people: an owner's changes to the users of its
organisation (each with its audit row, in one transaction), a user's own password, and
the audit list.

The last-owner rule is checked here, inside the transaction that makes the change: a
change that would leave an organisation without an active owner writes nothing (on
PostgreSQL the organisation's active owners are locked first, so two owners demoting
each other at once on two nodes cannot both succeed).
"""

from __future__ import annotations

from typing import Any

from gateway.store import sql as sq
from gateway.store.sql import Conn

#: outcomes of :func:`change_user`
CHANGED, NOT_FOUND, LAST_OWNER = "changed", "not_found", "last_owner"


def _active_owners(conn: Conn, org_id: str) -> list[str]:
    lock = "" if conn.dialect.name == "sqlite" else " FOR UPDATE"
    rows = sq.query(
        conn,
        "SELECT id FROM dashboard_users WHERE org_id = ? AND role = 'owner'"
        f" AND status = 'active' ORDER BY id{lock}",
        (org_id,),
    )
    return [row["id"] for row in rows]


def change_user(
    conn: Conn,
    org_id: str,
    user_id: str,
    values: dict[str, Any],
    audit: dict[str, Any],
    end_sessions: bool,
) -> str:
    """Change a user of ``org_id`` (its role or status) and record it, unless that leaves
    the organisation without an active owner. ``end_sessions`` signs the user out
    everywhere in the same transaction."""
    owners = _active_owners(conn, org_id)
    row = sq.select_one(conn, "dashboard_users", "WHERE id = ? AND org_id = ?", (user_id, org_id))
    if row is None:
        return NOT_FOUND
    after = {**row, **values}
    still_owner = after["role"] == "owner" and after["status"] == "active"
    if owners == [user_id] and not still_owner:
        return LAST_OWNER
    sq.update(conn, "dashboard_users", {"id": user_id}, values)
    if end_sessions:
        conn.execute("DELETE FROM dashboard_sessions WHERE user_id = ?", (user_id,))
    sq.insert(conn, "dashboard_audit", audit)
    return CHANGED


def set_own_password(
    conn: Conn, user_id: str, values: dict[str, Any], keep_session: str, audit: dict[str, Any]
) -> None:
    """A user's new password: every other session of the user ends, this one stays."""
    sq.update(conn, "dashboard_users", {"id": user_id}, values)
    conn.execute(
        "DELETE FROM dashboard_sessions WHERE user_id = ? AND id <> ?", (user_id, keep_session)
    )
    sq.insert(conn, "dashboard_audit", audit)


def insert_audit(conn: Conn, row: dict[str, Any]) -> None:
    sq.insert(conn, "dashboard_audit", row)


def audit_rows(
    conn: Conn, org_id: str, limit: int, before: tuple[float, str] | None = None
) -> list[dict[str, Any]]:
    """The organisation's audit list, newest first, a page of ``limit`` after ``before``
    (the ``(created_at, id)`` of the last row of the previous page)."""
    where = "WHERE org_id = ?"
    params: list[Any] = [org_id]
    if before is not None:
        where += " AND (created_at < ? OR (created_at = ? AND id < ?))"
        params += [before[0], before[0], before[1]]
    return sq.select(
        conn,
        "dashboard_audit",
        f"{where} ORDER BY created_at DESC, id DESC LIMIT ?",
        [*params, limit],
    )
