"""Store operations of several nodes on one database (DESIGN "Past one machine"): nodes on
PostgreSQL, or the workers of ``serve --workers`` on one SQLite file.

- ``cluster_nodes``: one row per live node, its epoch and when its registration expires
  (the database's clock decides; a node renews every few seconds).
- ``leases``: per limit id (``shards.leases``) and node, the amount of the limit's
  headroom the node holds: unused or reserved by its calls in flight. For every limit,
  at every commit: posted spend + the sum of its leases ≤ the limit.
- ``cluster_version``: a counter bumped by triggers (migrations 7 and 8) on every change to keys,
  organisations, credits added, provider credentials and model switches
  (``model_switches``: ``/admin/models`` for every node); nodes poll it.

A refill is one short transaction: a transaction-level advisory lock on the limit id
serialises the refills of one limit; the headroom is read in ONE statement (one
snapshot: a settlement moving an amount from a lease to posted spend in between cannot
be counted twice or not at all); the grant is :func:`shards.lease_size` of it. On
SQLite the transaction's write lock (``BEGIN IMMEDIATE``) serialises every refill and
settlement of every worker, and the row locks are left out. A
settlement moves what it posts out of its node's leases in its own transaction
(:func:`gateway.store.records.settle_call`). A dead node's pending rows are settled by
recovery and its leases dropped in one transaction (:func:`sweep`): until then its
leases cover its calls in flight.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import date

from gateway.store import records
from gateway.store import sql as sq
from gateway.store.sql import Conn
from shards import LeaseNeed, lease_size
from shards.windows import DAY_S, MINUTE_S

#: the database's clock, in epoch seconds (every node reads the same one); on SQLite
#: (``serve --workers``: the nodes share one machine) the machine's, to the millisecond
_NOW = {
    "postgresql": "EXTRACT(EPOCH FROM clock_timestamp())::float8",
    "sqlite": "((julianday('now') - 2440587.5) * 86400.0)",
}
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
#: a transaction-level advisory lock class for refills ("SVGL")
_LEASE_LOCK = 0x5356474C


class Fenced(Exception):
    """This node's registration is gone or expired: it holds no lease any more."""


def _pg(conn: Conn, clause: str) -> str:
    """``clause`` (a row lock, an advisory lock) on PostgreSQL; nothing on SQLite, where
    every write transaction holds the database's one write lock (``BEGIN IMMEDIATE``)."""
    return clause if conn.dialect.name == "postgresql" else ""


@dataclass(frozen=True, slots=True)
class Registration:
    epoch: int
    #: > 0: a live node holds this node id for that many more seconds (nothing done)
    held_s: float = 0.0


def register(conn: Conn, node_id: str, lease_s: float) -> Registration:
    """Register ``node_id`` for ``lease_s``; a registration of the same id that expired
    is swept first. Refuses (``held_s``) while another holder's has not expired."""
    now = _NOW[conn.dialect.name]
    rows = sq.query(
        conn,
        f"SELECT expires_at - {now} AS left_s FROM cluster_nodes WHERE node_id = ?",
        (node_id,),
    )
    if rows and rows[0]["left_s"] > 0:
        return Registration(0, rows[0]["left_s"])
    if rows:
        _sweep_nodes(conn, [node_id])
    epoch = time.time_ns()
    conn.execute(
        "INSERT INTO cluster_nodes (node_id, epoch, started_at, expires_at)"
        f" VALUES (?, ?, {now}, {now} + ?)",
        (node_id, epoch, lease_s),
    )
    return Registration(epoch)


def take_over(conn: Conn, node_id: str) -> dict[str, int]:
    """A supervisor restarting a worker it saw end (gateway/serving/workers.py): the
    predecessor's registration is swept now, expired or not (its pending rows settled by
    recovery, its leases dropped), so that the new worker registers under the same id at
    once. Only for a process known to be gone: a live holder would lose its leases."""
    rows = sq.query(
        conn,
        "SELECT node_id FROM cluster_nodes WHERE node_id = ?" + _pg(conn, " FOR UPDATE"),
        (node_id,),
    )
    if not rows:
        return {"calls": 0, "nanos": 0}
    return _sweep_nodes(conn, [node_id])


def renew(conn: Conn, node_id: str, epoch: int, lease_s: float) -> bool:
    """Extend the registration (and so every lease of the node); False when it is gone.

    A registration that expired but was not swept is extended too: its leases were never
    given to anyone (a sweep drops them with the registration, in one transaction, and
    holds the row meanwhile), and the node admitted nothing while it was fenced."""
    now = _NOW[conn.dialect.name]
    cursor = conn.execute(
        f"UPDATE cluster_nodes SET expires_at = {now} + ? WHERE node_id = ? AND epoch = ?",
        (lease_s, node_id, epoch),
    )
    return cursor.rowcount == 1


def leave(conn: Conn, node_id: str, epoch: int) -> None:
    """A node stopping: its registration expires now; what it leaves is swept."""
    conn.execute(
        f"UPDATE cluster_nodes SET expires_at = {_NOW[conn.dialect.name]}"
        " WHERE node_id = ? AND epoch = ?",
        (node_id, epoch),
    )


def _check_live(conn: Conn, node_id: str, epoch: int) -> None:
    rows = sq.query(
        conn,
        "SELECT 1 AS ok FROM cluster_nodes"
        f" WHERE node_id = ? AND epoch = ? AND expires_at > {_NOW[conn.dialect.name]}"
        + _pg(conn, " FOR SHARE"),
        (node_id, epoch),
    )
    if not rows:
        raise Fenced(node_id)


def _day(window: int) -> str:
    return date.fromordinal(_EPOCH_ORDINAL + window).isoformat()


def _month(window: int) -> str:
    return f"{window // 12:04d}-{window % 12 + 1:02d}"


def _month_end(window: int) -> float:
    year, month = divmod(window + 1, 12)
    return (date(year, month + 1, 1).toordinal() - _EPOCH_ORDINAL) * DAY_S


def window_end(need: LeaseNeed) -> float | None:
    """When the limit's window ends (its leases are then of no use), or None."""
    if need.kind in "rtop":
        return (need.window + 1) * MINUTE_S
    if need.kind == "d":
        return (need.window + 1) * DAY_S
    if need.kind in "mb":
        return _month_end(need.window)
    return None


def _used(need: LeaseNeed) -> tuple[str, tuple[object, ...]]:
    """The statement (a scalar subquery) of what the limit's window has posted."""
    family = "(key_id = ? OR parent_id = ?)"
    if need.kind == "d":
        return (
            f"SELECT COALESCE(SUM(settled_usd_nanos), 0) FROM requests WHERE {family} AND day = ?",
            (need.subject, need.subject, _day(need.window)),
        )
    if need.kind == "m":
        return (
            "SELECT COALESCE(SUM(settled_usd_nanos), 0) FROM requests"
            f" WHERE {family} AND month = ?",
            (need.subject, need.subject, _month(need.window)),
        )
    if need.kind == "b":
        return (
            "SELECT COALESCE(SUM(billed_usd_nanos), 0) FROM requests"
            " WHERE org_id = ? AND month = ?",
            (need.subject, _month(need.window)),
        )
    if need.kind == "c":  # the limit is the balance: purchases less debits
        return (
            "SELECT -COALESCE(SUM(amount_nanos), 0) FROM credit_ledger WHERE org_id = ?",
            (need.subject,),
        )
    return "SELECT 0", ()


def refill(conn: Conn, node_id: str, epoch: int, need: LeaseNeed, wanted: int = 0) -> int:
    """Grant the node more of the limit ``need`` names (at least ``need.amount``, up to
    ``wanted`` for the node's other waiting calls when the headroom has it, or nothing
    when the headroom cannot cover ``need.amount``); returns the grant. One transaction."""
    _check_live(conn, node_id, epoch)
    limit_id = need.limit_id
    if conn.dialect.name == "postgresql":
        conn.execute("SELECT pg_advisory_xact_lock(?, hashtext(?))", (_LEASE_LOCK, limit_id))
    used_sql, used_params = _used(need)
    row = sq.query(
        conn,
        f"SELECT ({used_sql}) AS used,"
        " (SELECT COALESCE(SUM(amount), 0) FROM leases WHERE limit_id = ?) AS leased,"
        f" (SELECT COUNT(*) FROM cluster_nodes WHERE expires_at > {_NOW[conn.dialect.name]})"
        " AS nodes",
        (*used_params, limit_id),
    )[0]
    limit = need.limit if need.limit is not None else 0
    headroom = limit - row["used"] - row["leased"]
    grant = lease_size(headroom, need.amount, row["nodes"], need.amount, wanted)
    if grant > 0:
        conn.execute(
            "INSERT INTO leases (limit_id, node_id, amount, window_end) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (limit_id, node_id) DO UPDATE SET amount = leases.amount + ?",
            (limit_id, node_id, grant, window_end(need), grant),
        )
    return grant


def give_back(conn: Conn, node_id: str, returned: list[tuple[str, int]]) -> None:
    """Unused leased amounts the node dropped from its book, back to their limits."""
    records.leave_leases(conn, node_id, returned)


def _sweep_nodes(conn: Conn, node_ids: list[str]) -> dict[str, int]:
    marks = ", ".join("?" for _ in node_ids)
    found = records.recover_pending(conn, f"node_id IN ({marks})", tuple(node_ids))
    conn.execute(f"DELETE FROM leases WHERE node_id IN ({marks})", tuple(node_ids))
    conn.execute(f"DELETE FROM cluster_nodes WHERE node_id IN ({marks})", tuple(node_ids))
    return found


def sweep(conn: Conn, now: float) -> dict[str, int]:
    """Any node's chore: the nodes whose registration expired lose their leases, and
    their pending rows are settled by recovery, in one transaction; leases of windows
    that ended (by ``now``, the node's clock) are dropped."""
    dead = [
        row["node_id"]
        for row in sq.query(
            conn,
            f"SELECT node_id FROM cluster_nodes WHERE expires_at <= {_NOW[conn.dialect.name]}"
            " ORDER BY node_id" + _pg(conn, " FOR UPDATE SKIP LOCKED"),
        )
    ]
    conn.execute("DELETE FROM leases WHERE window_end < ?", (now - MINUTE_S,))
    if not dead:
        return {"nodes": 0, "calls": 0, "nanos": 0}
    return {"nodes": len(dead), **_sweep_nodes(conn, dead)}


def recover_orphans(conn: Conn) -> dict[str, int]:
    """At a node's start: pending rows that no registered node covers (written before
    nodes were, or by a node whose registration is gone)."""
    return records.recover_pending(
        conn, "(node_id IS NULL OR node_id NOT IN (SELECT node_id FROM cluster_nodes))"
    )


def version(conn: Conn) -> int:
    rows = sq.query(conn, "SELECT version FROM cluster_version WHERE id = 1")
    return rows[0]["version"] if rows else 0


def switch_model(conn: Conn, model_id: str, enabled: bool, now: float) -> None:
    """An operator's switch of a model, for every node (``/admin/models``)."""
    sq.upsert(
        conn,
        "model_switches",
        {"model_id": model_id, "enabled": int(enabled), "changed_at": now},
    )


def model_switches(conn: Conn) -> dict[str, bool]:
    return {
        row["model_id"]: bool(row["enabled"])
        for row in sq.query(conn, "SELECT model_id, enabled FROM model_switches")
    }
