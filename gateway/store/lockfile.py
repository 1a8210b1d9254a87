"""One server per database.

Each server keeps the spend windows and balances of its shards in memory, so two servers
on one database would each admit spend the other cannot see, and caps could be
overshot. On SQLite a lock file beside the database says so (here); on PostgreSQL the
writer's connection holds an advisory lock (:mod:`gateway.store.postgres`), so there is
nothing to do here.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from gateway.store import StoreError, is_postgres


@contextmanager
def one_server_per_database(db: str) -> Iterator[None]:
    """Hold an exclusive lock on ``<db>.lock`` while the server runs, or refuse to run
    (:class:`StoreError`).

    The lock file sits beside the database (symlinks resolved) and names
    the holder's pid. The kernel drops the lock when the process ends, however it ends;
    on the way out the holder also removes the file (a start that fails leaves nothing
    beside the database), which is why a lock is only taken on a file that is still the
    one at that path. Nothing to lock: ``:memory:``, or a missing directory (the store
    then says so)."""
    database = Path(db).resolve()
    if is_postgres(db) or db == ":memory:" or not database.parent.is_dir():
        yield
        return
    path = database.with_name(f"{database.name}.lock")
    fd = _take_lock(path, database)
    try:
        yield
    finally:
        with suppress(OSError):
            if os.path.samestat(os.stat(path), os.fstat(fd)):
                path.unlink()
        os.close(fd)


def _take_lock(path: Path, database: Path) -> int:
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreError(f"cannot create the lock file {path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip()
            os.close(fd)
            pid = f" (pid {holder})" if holder.isdigit() else ""
            raise StoreError(
                f"another svc-gateway server{pid} is running on the database {database}"
                f" (it holds {path}); one server per database"
            ) from None
        except OSError as exc:
            os.close(fd)
            raise StoreError(f"cannot lock {path}: {exc.strerror or exc}") from None
        try:
            still_there = os.path.samestat(os.stat(path), os.fstat(fd))
        except FileNotFoundError:
            still_there = False
        if still_there:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return fd
        os.close(fd)  # its holder removed it on the way out: lock the file there now
