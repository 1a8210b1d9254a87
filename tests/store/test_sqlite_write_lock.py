"""SQLite's one write lock shared by processes (``serve --workers``): the store's writer
waits for it with short pauses, not SQLite's busy handler (whose sleeps grow to 100 ms:
a writer that met the lock once slept through many batches of the other workers).

Another process's transaction is played by a second connection to the same file that
holds ``BEGIN IMMEDIATE``.
"""

from __future__ import annotations

import sqlite3
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from gateway.store import Store, StoreError, records
from gateway.store import sqlite as backend
from tests.support.waiting import until

#: how long after the other transaction ends the waiting write may take to commit, the
#: median of a few rounds: well under SQLite's handler, which past half a second sleeps
#: 100 ms at a time (half of that on average)
PROMPT_S = 0.02


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    store = Store(str(tmp_path / "g.db"))
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        yield store
        nursery.cancel_scope.cancel()
    store.close()


def holder(store: Store) -> sqlite3.Connection:
    """Another writer of the file, holding its write lock."""
    other = sqlite3.connect(store.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    return other


def org(n: int) -> dict[str, object]:
    return {"id": f"org_{n}", "name": "a", "residency": None, "policy": {}, "created_at": 0.0}


async def lateness(store: Store, how: str, n: int) -> float:
    """Seconds from the end of another writer's transaction, held long enough that
    SQLite's own handler would be sleeping 100 ms at a time, to the commit of a write
    (``how``: a batch of the writer, or a short transaction of its own) that waited."""
    other = holder(store)
    done = trio.Event()
    began = 0.0

    async def write() -> None:
        nonlocal began
        began = time.perf_counter()
        await getattr(store, how)(records.create_org, org(n))
        done.set()

    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(write)
                await until(lambda: began, within=5, every=0.005)
                await until(lambda: time.perf_counter() - began > 0.6, within=5, every=0.01)
                assert not done.is_set()
                other.execute("COMMIT")
                released = time.perf_counter()
                await done.wait()
                return time.perf_counter() - released
    finally:
        other.close()


@pytest.mark.parametrize("how", ["write", "transact"])
async def test_a_write_waiting_for_another_writer_commits_as_soon_as_it_ends(
    store: Store, how: str
) -> None:
    """A batch of the writer, and a short transaction of its own (a lease refill)."""
    late = [await lateness(store, how, n) for n in range(5)]
    assert statistics.median(late) < PROMPT_S, late


async def test_a_lock_held_past_the_wait_refuses_the_write(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(backend, "LOCK_WAIT_S", 0.05)
    other = holder(store)
    try:
        with trio.fail_after(10), pytest.raises(StoreError, match="conflicts"):
            await store.write(records.create_org, org(0))
    finally:
        other.close()
    await store.write(records.create_org, org(1))  # the lock is free: writes go on
