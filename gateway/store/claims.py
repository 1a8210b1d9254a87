"""Store operations of the idempotency table: one row per (calling key, Idempotency-Key).

A row is written as a claim (state ``running``) in the transaction of its call's
pending request row, and given its outcome (or dropped) in the transaction of the
call's settlement (:mod:`gateway.store.records`).

One claim per key in the whole database, whichever node asks: the claim is an insert
that does nothing when the row exists (the primary key decides, and on PostgreSQL an
insert waits for a concurrent one to commit or roll back), read back when it did
nothing. Only the attempt whose insert landed calls the provider; every other one is
a repeat of it. Nothing kept in a process decides it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.store import sql as sq
from gateway.store.sql import Conn

#: how long an outcome is kept (DESIGN.md: 24 hours); start-up purges older rows
RETENTION_S = 24 * 3600


def get(conn: Conn, key_id: str, idem_key: str) -> dict[str, Any] | None:
    return sq.select_one(
        conn, "idempotency", "WHERE key_id = ? AND idem_key = ?", (key_id, idem_key)
    )


#: a claimed key whose call is in flight; what recovery makes of one whose process is gone
RUNNING, INTERRUPTED = "running", "interrupted"
#: outcomes kept in the table: a replayable answer, or only the original's id
STORED, NOT_STORED = "stored", "not_stored"


@dataclass(frozen=True, slots=True)
class Claim:
    """A call's hold on an Idempotency-Key: the rows it writes with the call's own."""

    idem_key: str
    body_hash: str
    request_id: str

    def running_row(self, key_id: str, stream: bool, now: float) -> dict[str, Any]:
        """The claim, written with the call's pending request row."""
        return {
            "key_id": key_id,
            "idem_key": self.idem_key,
            "body_hash": self.body_hash,
            "request_id": self.request_id,
            "state": RUNNING,
            "stream": int(stream),
            "status": None,
            "headers": {},
            "body": None,
            "created_at": now,
        }

    @staticmethod
    def outcome(*, stream: bool, answer: bytes | None, keep: bool) -> dict[str, Any]:
        """What a call answered 200 leaves, written with its settlement: its answer
        (not streamed, ``keep``), else only its id."""
        stored = answer is not None and keep and not stream
        return {
            "state": STORED if stored else NOT_STORED,
            "status": 200,
            "headers": {"Content-Type": "application/json"} if stored else {},
            "body": answer if stored else None,
        }


class ClaimHeld(Exception):
    """The Idempotency-Key is claimed by another attempt: ``row`` is its claim."""

    def __init__(self, row: dict[str, Any]) -> None:
        super().__init__(row["request_id"])
        self.row = row


def claim(conn: Conn, row: dict[str, Any]) -> dict[str, Any] | None:
    """Claim ``row``'s key for its call; None when claimed, else the claim that holds it.

    A claim past its retention (not purged yet) is taken over; one that disappears
    between the insert and the read (its attempt failed, dropping it) is claimed anew.
    """
    key = (row["key_id"], row["idem_key"])
    for _ in range(3):
        if sq.insert_new(conn, "idempotency", row):
            return None
        data = sq.encode("idempotency", row)
        sets = ", ".join(f"{column} = ?" for column in data)
        taken = conn.execute(
            f"UPDATE idempotency SET {sets} WHERE key_id = ? AND idem_key = ? AND created_at < ?",
            (*data.values(), *key, row["created_at"] - RETENTION_S),
        )
        if taken.rowcount == 1:
            return None
        held = get(conn, *key)
        if held is not None:
            return held
    raise RuntimeError(f"the claim of an Idempotency-Key kept changing: {key}")


def purge(conn: Conn, before: float) -> int:
    """Drop rows created before ``before``; returns how many."""
    return conn.execute("DELETE FROM idempotency WHERE created_at < ?", (before,)).rowcount


def settle(
    conn: Conn, key_id: str, idem_key: str, request_id: str, outcome: dict[str, Any] | None
) -> None:
    """The outcome of the claim of ``request_id``: its row updated with ``outcome``, or
    dropped (None). A claim is only ever settled by the call that holds it."""
    where = {"key_id": key_id, "idem_key": idem_key, "request_id": request_id}
    if outcome is None:
        conn.execute(
            "DELETE FROM idempotency WHERE key_id = ? AND idem_key = ? AND request_id = ?",
            tuple(where.values()),
        )
    else:
        sq.update(conn, "idempotency", where, outcome)


def interrupt_running(conn: Conn, requests: str = "", params: tuple[Any, ...] = ()) -> None:
    """Recovery: every claim whose call was in flight when its process died (or only
    those of the request ids the query ``requests`` selects)."""
    where = f" AND request_id IN ({requests})" if requests else ""
    conn.execute(
        f"UPDATE idempotency SET state = ? WHERE state = ?{where}", (INTERRUPTED, RUNNING, *params)
    )
