"""One server per database: an exclusive lock on ``<db>.lock`` while a server runs.

Each server keeps the spend windows and balances of its shards in memory, so two servers
on one database would each admit spend the other cannot see, and caps could be overshot.
The lock file sits beside the database (symlinks resolved) and names the holder's pid.
The kernel drops the lock when the process ends, however it ends; on the way out the
holder also removes the file (a start that fails leaves nothing beside the database),
which is why a lock is only taken on a file that is still the one at that path. Nothing
to lock: ``:memory:``, a missing directory (the store then says so), or a PostgreSQL URL
(there any number of servers run as nodes that lease their share of every limit:
:mod:`gateway.serving.node`).
"""

from __future__ import annotations

import fcntl
import os
from contextlib import suppress
from pathlib import Path

from gateway.store import is_postgres


class DatabaseLockError(Exception):
    """The lock cannot be had: another server holds it, or the file cannot be locked."""


class DatabaseLock:
    """``acquire()`` before opening the database, ``release()`` once the server stopped."""

    def __init__(self, db: str) -> None:
        self.database = Path(db).resolve()
        needed = not is_postgres(db) and db != ":memory:" and self.database.parent.is_dir()
        self.path = self.database.with_name(f"{self.database.name}.lock") if needed else None
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise :class:`DatabaseLockError` saying why not."""
        if self.path is not None:
            self._fd = _take_lock(self.path, self.database)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None or self.path is None:
            return
        with suppress(OSError):
            if os.path.samestat(os.stat(self.path), os.fstat(fd)):
                self.path.unlink()
        os.close(fd)


def _take_lock(path: Path, database: Path) -> int:
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            message = f"cannot create the lock file {path}: {exc.strerror or exc}"
            raise DatabaseLockError(message) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip()
            os.close(fd)
            pid = f" (pid {holder})" if holder.isdigit() else ""
            raise DatabaseLockError(
                f"another svc-gateway server{pid} is running on the database {database}"
                f" (it holds {path}); one server per database"
            ) from None
        except OSError as exc:
            os.close(fd)
            raise DatabaseLockError(f"cannot lock {path}: {exc.strerror or exc}") from None
        try:
            still_there = os.path.samestat(os.stat(path), os.fstat(fd))
        except FileNotFoundError:
            still_there = False
        if still_there:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return fd
        os.close(fd)  # its holder removed it on the way out: lock the file there now
