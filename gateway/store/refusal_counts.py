"""The counts of refused calls: table ``refusal_counts``, one row per key, error code, UTC
day and node, whose ``count`` grows by upsert (:mod:`gateway.observe.refused_calls` batches
the additions). No row describes a single refusal: a refused call leaves no record.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.store import sql as sq
from gateway.store.sql import Conn

#: one batch's addition: (key_id, code, day, node_id, org_id, count)
Addition = tuple[str, str, str, str, str, int]


def add_refusals(conn: Conn, additions: Sequence[Addition]) -> None:
    """Add each count to its row (made at the first refusal of its key, code and day)."""
    for addition in sorted(additions):  # one order on every node
        conn.execute(
            "INSERT INTO refusal_counts (key_id, code, day, node_id, org_id, count)"
            " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (key_id, code, day, node_id)"
            " DO UPDATE SET count = refusal_counts.count + excluded.count",
            addition,
        )


def refusal_rows(
    conn: Conn, key_ids: Sequence[str] | None, org_id: str | None, start: str, end: str
) -> list[dict[str, Any]]:
    """``{"day", "key_id", "code", "count"}`` from ``start`` to ``end`` (ISO days,
    inclusive), summed over the nodes: of ``key_ids``, or of every key of ``org_id``."""
    params: list[str]
    if key_ids is not None:
        marks = ", ".join("?" for _ in key_ids) or "NULL"
        where, params = f"key_id IN ({marks})", [*key_ids]
    else:
        assert org_id is not None, "the keys or their organisation"
        where, params = "org_id = ?", [org_id]
    return sq.query(
        conn,
        f"SELECT day, key_id, code, SUM(count) AS count FROM refusal_counts"
        f" WHERE {where} AND day >= ? AND day <= ?"
        " GROUP BY day, key_id, code ORDER BY day, key_id, code",
        [*params, start, end],
    )
