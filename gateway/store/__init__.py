"""The store: one SQLite file in WAL mode behind one async interface.

Writes go through a single writer task that batches them: it takes every operation
waiting in its channel (up to ``BATCH``), runs them on a worker thread in one
transaction with a savepoint each (one failing operation does not undo the others)
and commits once. A caller's ``await store.write(...)`` returns only after that
commit, so a settled amount is durable before the answer that reports it completes.

Reads run on a second connection on their own worker thread (WAL lets them proceed
while the writer commits). Before the writer runs (start-up, CLI bootstrap) the
same operations can be called synchronously with :meth:`Store.call`.

Operations are plain functions ``op(conn, *args)`` in :mod:`gateway.store.records`.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import trio

from gateway.logs import event
from gateway.store.sqlite import StoreError, connect

__all__ = ["Store", "StoreError"]

T = TypeVar("T")
BATCH = 256
log = logging.getLogger("gateway.store")


@dataclass(slots=True)
class _Pending:
    op: Callable[..., Any]
    args: tuple[Any, ...]
    done: trio.Event = field(default_factory=trio.Event)
    result: Any = None
    error: BaseException | None = None


class Store:
    def __init__(self, path: str) -> None:
        self.path = path
        self._write_conn = connect(path)
        self._read_conn = sqlite3.connect(
            path if path != ":memory:" else "file::memory:",
            check_same_thread=False,
            isolation_level=None,
        )
        self._read_conn.row_factory = sqlite3.Row
        self._read_limiter = trio.CapacityLimiter(1)
        self._write_limiter = trio.CapacityLimiter(1)
        self._send, self._receive = trio.open_memory_channel[_Pending](BATCH * 4)
        self._running = False
        #: when the batch being committed started (perf_counter), None between batches
        self._committing_since: float | None = None
        #: called with the seconds each batch took to commit (the writer's thread)
        self.on_commit: Callable[[float], None] | None = None

    # -- synchronous use, before serving -------------------------------------------------

    def call(self, op: Callable[..., T], *args: Any) -> T:
        """Run one operation now on the writer connection (start-up and CLI only)."""
        if self._running:
            raise RuntimeError("Store.call is for start-up; use await store.write()")
        self._write_conn.execute("BEGIN IMMEDIATE")
        try:
            result = op(self._write_conn, *args)
        except BaseException:
            self._write_conn.execute("ROLLBACK")
            raise
        self._write_conn.execute("COMMIT")
        return result

    # -- async use while serving ---------------------------------------------------------

    async def write(self, op: Callable[..., T], *args: Any) -> T:
        """Queue a write; return its result once the batch holding it is committed.

        Shielded: a caller cancelled mid-way (a client that disconnects) must not lose a
        settlement that is already on its way to disk.
        """
        if not self._running:
            return self.call(op, *args)
        pending = _Pending(op, args)
        with trio.CancelScope(shield=True):
            await self._send.send(pending)
            await pending.done.wait()
        if pending.error is not None:
            raise pending.error
        return pending.result

    async def read(self, op: Callable[..., T], *args: Any) -> T:
        return await trio.to_thread.run_sync(op, self._read_conn, *args, limiter=self._read_limiter)

    async def answers(self, timeout_s: float) -> bool:
        """Readiness: the writer runs, no batch has been committing for longer than
        ``timeout_s``, and a read is answered within ``timeout_s``."""
        since = self._committing_since
        if not self._running or (since is not None and time.perf_counter() - since > timeout_s):
            return False
        with trio.move_on_after(timeout_s):
            await trio.to_thread.run_sync(
                _ping, self._read_conn, limiter=self._read_limiter, abandon_on_cancel=True
            )
            return True
        return False

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The writer task: batch, commit, wake the callers. Runs until cancelled."""
        self._running = True
        task_status.started()
        try:
            while True:
                batch = [await self._receive.receive()]
                while len(batch) < BATCH:
                    try:
                        batch.append(self._receive.receive_nowait())
                    except trio.WouldBlock:
                        break
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(self._commit, batch, limiter=self._write_limiter)
                for pending in batch:
                    pending.done.set()
        finally:
            self._running = False
            self._drain()

    def _drain(self) -> None:
        """Once the writer is gone, commit what is still queued, right here.

        A writer's caller waits shielded: without this, a write queued while the writer
        is being cancelled (a background task when the server stops) would wait forever.
        Later writes see ``_running`` false and commit synchronously.
        """
        batch: list[_Pending] = []
        while True:
            try:
                batch.append(self._receive.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
        if batch:
            self._commit(batch)
        for pending in batch:
            pending.done.set()

    def _commit(self, batch: list[_Pending]) -> None:
        self._committing_since = started = time.perf_counter()
        try:
            self._commit_batch(batch)
        finally:
            self._committing_since = None
        if self.on_commit is not None:
            self.on_commit(time.perf_counter() - started)

    def _commit_batch(self, batch: list[_Pending]) -> None:
        conn = self._write_conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            for index, pending in enumerate(batch):
                conn.execute(f"SAVEPOINT op{index}")
                try:
                    pending.result = pending.op(conn, *pending.args)
                    conn.execute(f"RELEASE op{index}")
                except Exception as exc:  # one bad op must not undo the batch
                    conn.execute(f"ROLLBACK TO op{index}")
                    conn.execute(f"RELEASE op{index}")
                    pending.error = exc
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            log.error("store commit failed: %s", exc, extra=event("store_error", error=str(exc)))
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            for pending in batch:
                pending.error = StoreError(f"store write failed: {exc}")

    def close(self) -> None:
        self._read_conn.close()
        self._write_conn.close()


def _ping(conn: sqlite3.Connection) -> None:
    conn.execute("SELECT version FROM schema_migrations LIMIT 1").fetchall()
