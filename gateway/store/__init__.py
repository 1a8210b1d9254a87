"""The store: one database behind one async interface (SQLite by default, or PostgreSQL).

``Store(db)`` opens PostgreSQL when ``db`` is a ``postgresql://`` URL
(:mod:`gateway.store.postgres`) and an SQLite file otherwise (:mod:`gateway.store.sqlite`);
nothing outside this package knows which.

Writes go through a single writer task that batches them: it takes every operation
waiting in its channel (up to ``BATCH``), runs them on the writer connection's own
thread (:mod:`gateway.store.thread`) in one transaction (one failing operation does
not undo the others: see :meth:`Store._commit`) and commits once. A caller's
``await store.write(...)`` returns only after that commit, so a settled amount is
durable before the answer that reports it completes.

At light load a write skips the writer (:meth:`Store._commit_here`): on SQLite, when no
other write is queued or committing, no other task is ready to run, the file's write lock
is free and recent commits were quick, the caller's operation is committed right away on
the serving thread, the same transaction with the same ``fsync``. A lone call's two
commits then cost no thread hand-offs and no writer-task wake-ups (bench/RESULTS.md, issue
49); under load the writer's batches still amortise the commits.

Reads run on a second connection on a thread of its own. Before the writer runs
(start-up, CLI bootstrap) the same operations can be called synchronously with
:meth:`Store.call`.

Transactions of several nodes can conflict (PostgreSQL: a deadlock, a serialization
failure). The operations of a batch take their row locks in one order: the batch is
sorted by the order each operation declares (:data:`gateway.store.sql.LOCK_ORDER`: key
rows, organisation rows, Idempotency-Key claims, then rows the call owns). A conflict
that still happens rolls the batch back and runs it again after a short random pause,
up to :data:`CONFLICT_TRIES` times; an operation that keeps losing is refused
(:class:`StoreError`, which callers answer with a retryable 503), unless it
``must_land``: a settlement is then *deferred*, retried on its own until it commits,
and counted by :attr:`Store.deferred` meanwhile (readiness reports it). A short
transaction of its own (:meth:`Store.transact`) is retried the same way.

A database server can go away while serving. Then the store is *unavailable*: a write
that is not ``must_land`` is refused at once (:class:`StoreError`: the caller answers
503 instead of serving unrecorded), and so is a read; a ``must_land`` write (a
settlement) waits, and the writer reconnects (with back-off) and commits it once the
database is back. A batch cut by the loss is rolled back, or found committed when the
loss came during COMMIT, and its operations are told which.

Operations are plain functions ``op(conn, *args)`` over :class:`gateway.store.sql.Conn`
in :mod:`gateway.store.records`, ``idempotency`` and ``webhooks``.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast

import trio

from gateway.observe.logs import event
from gateway.store.sql import LOCK_ORDER, OWN_ROWS, Conn
from gateway.store.store_error import StoreError
from gateway.store.thread import ConnThread

__all__ = ["Store", "StoreError", "is_postgres"]

T = TypeVar("T")
BATCH = 256
#: how long a read waits after a failed reconnect before it tries again
READ_RETRY_S = 0.5
RECONNECT_BACKOFF_S = (0.1, 0.2, 0.5, 1.0)
UNAVAILABLE = "the database is unavailable; retry shortly"
#: how long a ``must_land`` write waits for a database that went away before its caller
#: is told (StoreError); the write stays queued and lands if the database comes back
MUST_LAND_WAIT_S = 15.0
#: how often a transaction that lost a conflict is run (then refused, or deferred)
CONFLICT_TRIES = 5
#: the pause before the n-th run after a conflict: up to this × 2^n seconds, at random
#: (two nodes that deadlocked must not meet again at the same instant)
CONFLICT_PAUSE_S = 0.005
#: how often a deferred settlement is tried again
DEFERRED_RETRY_S = 0.5
#: a write is committed on the serving thread only while commits take less than this
#: (a moving average): the serving thread waits for it, and a slow disk must not stall it
HERE_COMMIT_S = 0.002
#: the weight of the last commit in that average
HERE_WEIGHT = 0.2
CONFLICT = "the database refused the write after repeated conflicts; retry shortly"
log = logging.getLogger("gateway.store")


class Backend(Protocol):
    name: str
    errors: tuple[type[BaseException], ...]

    def open_writer(self) -> Conn: ...
    def reconnect_writer(self) -> Conn: ...
    def open_reader(self) -> Conn: ...
    def open_transactions(self) -> Conn: ...
    def begin(self, conn: Conn) -> object: ...
    def begin_at_once(self, conn: Conn) -> bool: ...
    def in_transaction(self, conn: Conn) -> bool: ...
    def lost(self, conn: Conn, exc: BaseException) -> bool: ...
    def committed(self, conn: Conn, token: object) -> bool: ...
    def retryable(self, exc: BaseException) -> bool: ...
    def close(self, conn: Conn) -> None: ...
    def tables(self, conn: Conn) -> list[str]: ...
    def after_copy(self, conn: Conn, table: str) -> None: ...


def is_postgres(db: str) -> bool:
    """A ``postgresql://`` URL names a PostgreSQL database; anything else an SQLite file."""
    return db.startswith(("postgresql://", "postgres://"))


def open_backend(db: str) -> Backend:
    """The backend of ``db``; its driver is imported only when it is used."""
    if is_postgres(db):
        from gateway.store.postgres import PostgresBackend

        return PostgresBackend(db)
    from gateway.store.sqlite import SqliteBackend

    return SqliteBackend(db)


class _Done:
    """The end of one queued write, for the one task that waits for it: ``trio.Event``'s
    part that the store uses, with a wait that a cancellation cannot end (a write's
    caller must see its write to the end) without a shielded scope around it (a scope
    costs about fifty function calls, a fifth of a write's cost to its caller)."""

    __slots__ = ("_set", "_task")

    def __init__(self) -> None:
        self._set = False
        self._task: trio.lowlevel.Task | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if not self._set:
            self._set = True
            if self._task is not None:
                trio.lowlevel.reschedule(self._task)
                self._task = None

    async def wait(self, *, cancellable: bool) -> None:
        """Until :meth:`set` (at once if it was); ``cancellable``: a cancellation (of a
        scope of the caller's) ends the wait too."""
        if self._set:  # the write is done: its caller sees it (the pass cannot cancel)
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        self._task = trio.lowlevel.current_task()

        def abort(_: object) -> trio.lowlevel.Abort:
            if not cancellable:
                return trio.lowlevel.Abort.FAILED  # set() reschedules the task
            self._task = None
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)


@dataclass(slots=True)
class _Pending:
    op: Callable[..., Any]
    args: tuple[Any, ...]
    must_land: bool = False
    done: _Done = field(default_factory=_Done)
    result: Any = None
    error: BaseException | None = None
    #: how many of its batch's runs this operation lost to a conflict
    conflicts: int = 0
    #: it lost every run (a ``must_land`` one): committed later on its own
    deferred: bool = False

    def lock_order(self) -> tuple[Any, ...]:
        """Where it stands in its batch: the order of the row locks it takes."""
        order = LOCK_ORDER.get(self.op)
        return order(*self.args) if order is not None else (OWN_ROWS,)


def _pause(conflicts: int) -> None:
    """The random pause before running again what lost ``conflicts`` conflicts."""
    time.sleep(random.uniform(0, CONFLICT_PAUSE_S * 2**conflicts))


class _Lost(Exception):
    """The connection went away during a batch; ``token`` names its transaction and
    ``committing`` says whether COMMIT had been sent (then its outcome is unknown)."""

    def __init__(self, token: object, committing: bool) -> None:
        self.token = token
        self.committing = committing


class Store:
    def __init__(self, db: str) -> None:
        self.backend = open_backend(db)
        #: the database as configured (an SQLite path, or a URL that may hold a password)
        self.path = db
        #: what to call the database in messages (a URL without its password)
        self.name = self.backend.name
        self._write_conn: Conn | None = self.backend.open_writer()
        self._read_conn: Conn | None = None
        #: connection attribute → when it may be opened again after a failure
        self._retry_at: dict[str, float] = {}
        self._read_thread = ConnThread("store reader")
        #: the connection of short transactions of their own (:meth:`transact`)
        self._own_conn: Conn | None = None
        self._own_thread = ConnThread("store transactions")
        self._write_thread = ConnThread("store writer")
        self._send, self._receive = trio.open_memory_channel[_Pending](BATCH * 4)
        #: writes to commit again after a lost connection, before any new one
        self._carried: list[_Pending] = []
        #: settlements that kept losing conflicts, tried again on their own
        self._deferred: list[_Pending] = []
        self._deferred_added = trio.Event()
        self._running = False
        #: False while the database cannot be reached (reads and writes refused)
        self.available = True
        #: when the batch being committed started (perf_counter), None between batches
        self._committing_since: float | None = None
        #: called with the seconds each batch took to commit (the writer's thread)
        self.on_commit: Callable[[float], None] | None = None
        #: a batch is being taken, committed or handed back by the writer task
        self._writing = False
        #: the moving average of commit times (None: none measured yet)
        self._commit_s: float | None = None

    # -- synchronous use, before serving -------------------------------------------------

    def call(self, op: Callable[..., T], *args: Any) -> T:
        """Run one operation now on the writer connection (start-up and CLI only)."""
        if self._running:
            raise RuntimeError("Store.call is for start-up; use await store.write()")
        conn = self._writer()
        self.backend.begin(conn)
        try:
            result = op(conn, *args)
        except BaseException:
            conn.execute("ROLLBACK", ())
            raise
        conn.execute("COMMIT", ())
        return result

    def _writer(self) -> Conn:
        if self._write_conn is None:
            self._write_conn = self.backend.reconnect_writer()
            self.available = True
        return self._write_conn

    # -- async use while serving ---------------------------------------------------------

    async def write(self, op: Callable[..., T], *args: Any, must_land: bool = False) -> T:
        """Queue a write; return its result once the batch holding it is committed.

        Shielded: a caller cancelled mid-way (a client that disconnects) must not lose a
        settlement that is already on its way to disk. While the database is unavailable
        a write is refused (:class:`StoreError`) unless it ``must_land``: then it stays
        queued until the database is back and it is committed, and its caller waits for
        that up to ``MUST_LAND_WAIT_S`` (a server stopping must not wait forever; a
        pending row that never gets its settlement is settled by the next start's
        recovery).
        """
        if not self._running:
            return self.call(op, *args)
        if not self.available and not must_land:
            raise StoreError(UNAVAILABLE)
        pending = _Pending(op, args, must_land)
        if self._idle() and self._commit_here(pending):
            await trio.lowlevel.cancel_shielded_checkpoint()
            if pending.error is not None:
                raise pending.error
            return cast(T, pending.result)
        if must_land:
            # one scope, shielded and with its own deadline (which a shield does not block)
            with trio.CancelScope(shield=True, deadline=trio.current_time() + MUST_LAND_WAIT_S):
                if not self._queued(pending):
                    await self._send.send(pending)
                await pending.done.wait(cancellable=True)
        else:
            # no scope while the queue has room: the wait below cannot be cancelled
            if not self._queued(pending):
                with trio.CancelScope(shield=True):
                    await self._send.send(pending)
            await pending.done.wait(cancellable=False)
        if not pending.done.is_set():
            raise StoreError(UNAVAILABLE)
        if pending.error is not None:
            raise pending.error
        return cast(T, pending.result)

    def _idle(self) -> bool:
        """Nothing to wait for: no other write queued or committing, no other task
        ready to run, and quick commits lately."""
        return (
            not self._writing
            and self.available
            and self._commit_s is not None
            and self._commit_s < HERE_COMMIT_S
            and not self._carried
            and self._receive.statistics().current_buffer_used == 0
            and trio.lowlevel.current_statistics().tasks_runnable == 0
        )

    def _commit_here(self, pending: _Pending) -> bool:
        """Commit ``pending`` now, on this thread, if its transaction can begin without
        waiting (False: the writer takes it). An operation's error is its own (rolled
        back), as in a batch; a conflict, or a failure of the transaction itself, leaves
        it to the writer, which retries and reports as it does for its batches."""
        conn, backend = self._write_conn, self.backend
        if conn is None:
            return False
        started = time.perf_counter()
        try:
            if not backend.begin_at_once(conn):
                return False
            try:
                pending.result = pending.op(conn, *pending.args)
            except Exception as exc:
                conn.execute("ROLLBACK", ())
                if isinstance(exc, backend.errors) and backend.retryable(exc):
                    pending.result = None
                    return False
                pending.error = exc
                return True
            conn.execute("COMMIT", ())
        except backend.errors:
            if backend.in_transaction(conn):
                conn.execute("ROLLBACK", ())
            pending.result = pending.error = None
            return False
        self._committed(time.perf_counter() - started)
        return True

    def _committed(self, seconds: float) -> None:
        average = self._commit_s
        self._commit_s = seconds if average is None else average + HERE_WEIGHT * (seconds - average)
        if self.on_commit is not None:
            self.on_commit(seconds)

    def _queued(self, pending: _Pending) -> bool:
        """Queued at once (False: no room); no scheduler pass: the caller's wait is one."""
        try:
            self._send.send_nowait(pending)
        except trio.WouldBlock:
            return False
        return True

    async def read(self, op: Callable[..., T], *args: Any) -> T:
        return await self._read_thread.run(self._read, op, args)

    def _read(self, op: Callable[..., T], args: tuple[Any, ...]) -> T:
        return self._on_own_conn("_read_conn", lambda conn: op(conn, *args))

    async def transact(self, op: Callable[..., T], *args: Any) -> T:
        """Run ``op`` now in a short transaction of its own, on a connection of its own
        (a lease refill: it must not wait behind a batch, nor hold a batch's locks).
        A lost database is a :class:`StoreError`; an error of ``op`` rolls back."""
        return await self._own_thread.run(self._transact, op, args)

    def _transact(self, op: Callable[..., T], args: tuple[Any, ...]) -> T:
        backend = self.backend

        def once(conn: Conn) -> T:
            backend.begin(conn)
            try:
                result = op(conn, *args)
                conn.execute("COMMIT", ())
            except BaseException:
                if backend.in_transaction(conn):
                    conn.execute("ROLLBACK", ())
                raise
            return result

        def run(conn: Conn) -> T:
            for conflicts in range(1, CONFLICT_TRIES + 1):
                try:
                    return once(conn)
                except backend.errors as exc:
                    if backend.lost(conn, exc) or not backend.retryable(exc):
                        raise
                    if conflicts < CONFLICT_TRIES:
                        _pause(conflicts)
            raise StoreError(CONFLICT)

        return self._on_own_conn("_own_conn", run, self.backend.open_transactions)

    def _on_own_conn(
        self, slot: str, run: Callable[[Conn], T], opener: Callable[[], Conn] | None = None
    ) -> T:
        """``run`` on the connection kept in attribute ``slot`` (opened by ``opener``, the
        backend's reader by default, when missing, at most every READ_RETRY_S after a
        failure); a lost database is a StoreError."""
        conn: Conn | None = getattr(self, slot)
        if conn is None:
            if time.monotonic() < self._retry_at.get(slot, 0.0):
                raise StoreError(UNAVAILABLE)
            try:
                conn = (opener or self.backend.open_reader)()
            except StoreError:
                self._retry_at[slot] = time.monotonic() + READ_RETRY_S
                raise StoreError(UNAVAILABLE) from None
            setattr(self, slot, conn)
        try:
            return run(conn)
        except self.backend.errors as exc:
            if not self.backend.lost(conn, exc):
                raise
            setattr(self, slot, None)
            self.backend.close(conn)
            raise StoreError(UNAVAILABLE) from None

    async def answers(self, timeout_s: float) -> bool:
        """Readiness: the writer runs, no batch has been committing for longer than
        ``timeout_s``, the database is reachable (not :attr:`available` while the writer
        reconnects) and a read is answered within ``timeout_s``."""
        since = self._committing_since
        if not self._running or not self.available:
            return False
        if since is not None and time.perf_counter() - since > timeout_s:
            return False
        with trio.move_on_after(timeout_s):
            try:
                await self._read_thread.run(self._read, _ping, (), abandon_on_cancel=True)
            except StoreError:
                return False
            return True
        return False

    @property
    def deferred(self) -> int:
        """Settlements waiting to be committed on their own (after repeated conflicts)."""
        return len(self._deferred)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The writer task: batch, commit, wake the callers. Runs until cancelled."""
        self._running = True
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._retry_deferred)
                task_status.started()
                await self._write_batches()
        finally:
            self._running = False
            self._drain(self._carried + self._deferred)

    async def _write_batches(self) -> None:
        while True:
            self._writing = False
            batch = self._carried or [await self._receive.receive()]
            self._writing = True
            self._carried = []
            while len(batch) < BATCH:
                try:
                    batch.append(self._receive.receive_nowait())
                except trio.WouldBlock:
                    break
            lost = await self._write_thread.run(self._commit, batch, shielded=True)
            if lost is not None:
                self._carried = batch
                await self._recover(lost)
                continue
            for pending in batch:
                if pending.deferred:
                    self._deferred.append(pending)
                    self._deferred_added.set()
                else:
                    pending.done.set()

    async def _retry_deferred(self) -> None:
        """Commit each deferred settlement on its own, again and again, until it lands
        (its caller may have stopped waiting: the amount must still reach the store)."""
        while True:
            if not self._deferred:
                self._deferred_added = trio.Event()
                await self._deferred_added.wait()
            await trio.sleep(DEFERRED_RETRY_S)
            for pending in list(self._deferred):
                try:
                    pending.result = await self.transact(pending.op, *pending.args)
                except StoreError:
                    continue  # lost again, or the database is away: the next round
                except Exception as exc:
                    pending.error = exc
                    log.error(
                        "deferred store write failed: %s",
                        exc,
                        extra=event("store_error", error=str(exc)),
                    )
                self._deferred.remove(pending)
                pending.done.set()

    async def _recover(self, lost: _Lost) -> None:
        """After a lost connection: refuse what may be refused, reconnect, and leave in
        ``_carried`` the operations to commit again (the ``must_land`` ones of a batch that
        did not commit; a writer stopped meanwhile drains them)."""
        self.available = False
        log.error(
            "store: the database connection was lost; reconnecting",
            extra=event("store_error", error="connection lost"),
        )
        if not lost.committing:
            self._carried = self._refuse(self._carried)
        attempt = 0
        while True:
            await trio.sleep(RECONNECT_BACKOFF_S[min(attempt, len(RECONNECT_BACKOFF_S) - 1)])
            attempt += 1
            try:
                committed = await self._write_thread.run(self._reconnect, lost)
            except StoreError as exc:
                if attempt % 20 == 1:
                    log.error("store: %s", exc)
                continue
            log.info("store: the database is back")
            if committed:
                for pending in self._carried:
                    pending.done.set()
                self._carried = []
            else:
                self._carried = self._refuse(self._carried)
            return

    def _reconnect(self, lost: _Lost) -> bool:
        """A new writer connection; True when the lost batch turns out to be committed."""
        conn = self._writer()
        if not lost.committing:
            return False
        try:
            return self.backend.committed(conn, lost.token)
        except self.backend.errors as exc:
            self._write_conn = None
            self.backend.close(conn)
            raise StoreError(f"the database went away again: {exc}") from None

    def _refuse(self, batch: list[_Pending]) -> list[_Pending]:
        """Refuse the operations of a rolled-back batch that need not land; keep the rest."""
        kept = []
        for pending in batch:
            pending.result, pending.error = None, None
            if pending.must_land:
                kept.append(pending)
            else:
                pending.error = StoreError(UNAVAILABLE)
                pending.done.set()
        return kept

    def _drain(self, carried: list[_Pending]) -> None:
        """Once the writer is gone, commit what is still queued, right here.

        A writer's caller waits shielded: without this, a write queued while the writer
        is being cancelled (a background task when the server stops) would wait forever.
        Later writes see ``_running`` false and commit synchronously.
        """
        batch = list(carried)
        for pending in batch:  # a deferred settlement gets one more full try
            pending.conflicts, pending.deferred = 0, False
        while True:
            try:
                batch.append(self._receive.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
        if batch:
            try:
                lost = self._commit(batch)
            except StoreError as exc:
                lost = None
                for pending in batch:
                    pending.error = exc
            for pending in batch:
                if lost is not None:
                    pending.error = StoreError(UNAVAILABLE)
                elif pending.deferred:
                    pending.error = StoreError(CONFLICT)
        for pending in batch:
            pending.done.set()

    def _commit(self, batch: list[_Pending]) -> _Lost | None:
        self._committing_since = started = time.perf_counter()
        try:
            lost = self._commit_batch(batch)
        finally:
            self._committing_since = None
        if lost is None:
            self._committed(time.perf_counter() - started)
        return lost

    def _commit_batch(self, batch: list[_Pending]) -> _Lost | None:
        """Commit ``batch`` in one transaction (on the writer's thread); a lost
        connection is returned, for :meth:`_recover`.

        Optimistic: the operations run one after the other, in their lock order, with no
        savepoint (a savepoint costs two round trips an operation on a database server);
        one that fails gets its error, the transaction is rolled back and the others run
        again without it. One that lost a conflict (a deadlock) makes the whole batch run
        again after a pause; after :data:`CONFLICT_TRIES` it is refused or deferred and
        the others run without it.
        """
        conn = self._writer()
        backend = self.backend
        todo = sorted(batch, key=_Pending.lock_order) if len(batch) > 1 else list(batch)
        while todo:
            token: object = None
            committing = False
            conflicted: _Pending | None = None
            try:
                token = backend.begin(conn)
                for pending in todo:
                    try:
                        pending.result = pending.op(conn, *pending.args)
                    except Exception as exc:
                        if isinstance(exc, backend.errors) and backend.lost(conn, exc):
                            raise
                        if isinstance(exc, backend.errors) and backend.retryable(exc):
                            conflicted = pending
                        else:
                            pending.error = exc
                        break
                else:
                    committing = True
                    conn.execute("COMMIT", ())
                    return None
                conn.execute("ROLLBACK", ())  # one bad op must not undo the others
            except backend.errors as exc:
                if backend.lost(conn, exc):
                    self._write_conn = None
                    backend.close(conn)
                    return _Lost(token, committing)
                if backend.in_transaction(conn):
                    conn.execute("ROLLBACK", ())
                if not backend.retryable(exc):
                    log.error(
                        "store commit failed: %s", exc, extra=event("store_error", error=str(exc))
                    )
                    for pending in todo:
                        pending.error = StoreError(f"store write failed: {exc}")
                    return None
                conflicted = todo[-1]  # the COMMIT lost: count it against the batch
            if conflicted is not None:
                conflicted.conflicts += 1
                if conflicted.conflicts < CONFLICT_TRIES:
                    _pause(conflicted.conflicts)
                    continue
                if conflicted.must_land:
                    conflicted.deferred = True
                else:
                    conflicted.error = StoreError(CONFLICT)
            todo = [p for p in todo if p.error is None and not p.deferred]
        return None

    def close(self) -> None:
        for thread in (self._read_thread, self._write_thread, self._own_thread):
            thread.stop()
        for conn in (self._read_conn, self._write_conn, self._own_conn):
            if conn is not None:
                self.backend.close(conn)
        self._read_conn = self._write_conn = self._own_conn = None


def _ping(conn: Conn) -> None:
    conn.execute("SELECT version FROM schema_migrations LIMIT 1", ()).fetchall()
