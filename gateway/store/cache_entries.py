"""Store operations of the response cache (:mod:`gateway.calls.cache`): one row per key.

A row is a claim (state ``pending``: a call is asking its provider for this key; the
others wait for it) or an entry (state ``stored``: the answer, what it cost, the request
that paid for it). One claim per key in the whole database, whichever node or worker
asks: the claim is an insert that does nothing when the row exists (the primary key
decides), or takes over a claim or an entry past its time. Nothing kept in a process
decides it; a process only keeps its own waiters on an event.

Rows hold no USD as floats: ``cost_nanos`` is the original's settled nano-USD.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.store import records
from gateway.store import sql as sq
from gateway.store.sql import Conn

PENDING, STORED = "pending", "stored"

_COLUMNS = (
    "cache_key",
    "org_id",
    "state",
    "owner",
    "created_at",
    "expires_at",
    "request_id",
    "cost_nanos",
    "entry",
)


def _row(row: dict[str, Any]) -> dict[str, Any]:
    out = dict(row)
    if out.get("entry") is not None:
        out["entry"] = orjson.loads(out["entry"])
    return out


def lookup(conn: Conn, cache_key: str) -> dict[str, Any] | None:
    """The row of ``cache_key`` (a claim or an entry, fresh or not), or None."""
    rows = sq.query(conn, "SELECT * FROM cache_entries WHERE cache_key = ?", (cache_key,))
    return _row(rows[0]) if rows else None


def claim(
    conn: Conn, cache_key: str, org_id: str, owner: str, now: float, until: float
) -> dict[str, Any] | None:
    """Claim ``cache_key`` for the call ``owner`` until ``until``: None when claimed,
    else the row that holds the key (a live claim, or a fresh entry to serve)."""
    values = (cache_key, org_id, PENDING, owner, now, until, None, 0, None)
    marks = ", ".join("?" for _ in _COLUMNS)
    inserted = conn.execute(
        f"INSERT INTO cache_entries ({', '.join(_COLUMNS)}) VALUES ({marks})"
        " ON CONFLICT DO NOTHING",
        values,
    )
    if inserted.rowcount == 1:
        return None
    # a claim or an entry past its time is taken over
    taken = conn.execute(
        "UPDATE cache_entries SET org_id = ?, state = ?, owner = ?, created_at = ?,"
        " expires_at = ?, request_id = NULL, cost_nanos = 0, entry = NULL"
        " WHERE cache_key = ? AND expires_at <= ?",
        (org_id, PENDING, owner, now, until, cache_key, now),
    )
    if taken.rowcount == 1:
        return None
    return lookup(conn, cache_key)


def put(
    conn: Conn,
    cache_key: str,
    org_id: str,
    now: float,
    expires_at: float,
    request_id: str,
    cost_nanos: int,
    entry: dict[str, Any],
) -> None:
    """Store an answer under ``cache_key`` (over its claim, or over an older entry)."""
    values = (
        cache_key,
        org_id,
        STORED,
        None,
        now,
        expires_at,
        request_id,
        cost_nanos,
        orjson.dumps(entry).decode(),
    )
    sets = ", ".join(f"{column} = excluded.{column}" for column in _COLUMNS[1:])
    marks = ", ".join("?" for _ in _COLUMNS)
    conn.execute(
        f"INSERT INTO cache_entries ({', '.join(_COLUMNS)}) VALUES ({marks})"
        f" ON CONFLICT (cache_key) DO UPDATE SET {sets}",
        values,
    )


def settle_and_store(conn: Conn, entry: tuple[Any, ...], *settlement: Any) -> None:
    """A miss's settlement (:func:`gateway.store.records.settle_call`) and its entry
    (:func:`put`'s arguments), in one transaction: the answer costs no commit of its own."""
    records.settle_call(conn, *settlement)
    put(conn, *entry)


def release(conn: Conn, cache_key: str, owner: str) -> None:
    """Drop the claim of ``owner`` (its call failed: its waiters make their own)."""
    conn.execute(
        "DELETE FROM cache_entries WHERE cache_key = ? AND state = ? AND owner = ?",
        (cache_key, PENDING, owner),
    )


def clear(conn: Conn, org_id: str | None) -> int:
    """Drop the entries (and claims) of one organisation, or all; how many."""
    if org_id is None:
        return conn.execute("DELETE FROM cache_entries", ()).rowcount
    return conn.execute("DELETE FROM cache_entries WHERE org_id = ?", (org_id,)).rowcount


def sweep(conn: Conn, now: float, max_entries: int) -> int:
    """Drop what expired, then the oldest entries past ``max_entries``; the rows left."""
    conn.execute("DELETE FROM cache_entries WHERE expires_at <= ?", (now,))
    count = int(sq.query(conn, "SELECT COUNT(*) AS n FROM cache_entries")[0]["n"])
    if count > max_entries:
        conn.execute(
            "DELETE FROM cache_entries WHERE cache_key IN (SELECT cache_key FROM"
            " cache_entries ORDER BY created_at, cache_key LIMIT ?)",
            (count - max_entries,),
        )
        count = max_entries
    return count


def record_hit(conn: Conn, row: dict[str, Any]) -> None:
    """The request record of a call served from the cache (settled 0)."""
    sq.insert(conn, "requests", row)


def saved_by_key(conn: Conn, org_id: str, start: float, end: float) -> dict[str, int]:
    """What hits saved per key of an organisation between two times (nano-USD)."""
    rows = sq.query(
        conn,
        "SELECT key_id, SUM(saved_usd_nanos) AS saved FROM requests"
        " WHERE org_id = ? AND cache = 'hit' AND created >= ? AND created < ?"
        " GROUP BY key_id",
        (org_id, start, end),
    )
    return {row["key_id"]: int(row["saved"] or 0) for row in rows}
