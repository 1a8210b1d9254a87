"""A write at light load (issue 49): committed at once on the serving thread, with no
hand-off to the writer's thread, when nothing else waits; the writer's batches otherwise.

Which thread committed an operation is what the operation itself sees: the operations
here record ``threading.get_ident()``.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import gateway.store as store_module
from gateway.store import Store, records
from gateway.store.sql import Conn

SERVING = threading.get_ident()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    store = Store(str(tmp_path / "g.db"))
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        # the first commit goes through the writer: it measures how long commits take
        await store.write(records.create_org, org("warm"))
        yield store
        nursery.cancel_scope.cancel()
    store.close()


def org(name: str) -> dict[str, object]:
    return {"id": name, "name": name, "residency": None, "policy": {}, "created_at": 0.0}


def create_org_noting_thread(conn: Conn, row: dict[str, Any], threads: list[int]) -> None:
    threads.append(threading.get_ident())
    records.create_org(conn, row)


def failing(conn: Conn, row: dict[str, Any]) -> None:
    records.create_org(conn, row)
    raise ValueError("the operation's own failure")


def names(store: Store) -> set[str]:
    """The organisations another connection to the file sees (committed rows only)."""
    other = sqlite3.connect(store.path)
    try:
        return {row[0] for row in other.execute("SELECT id FROM orgs")}
    finally:
        other.close()


async def test_a_lone_write_commits_on_the_serving_thread_before_it_returns(
    store: Store,
) -> None:
    threads: list[int] = []
    for n in range(3):
        await store.write(create_org_noting_thread, org(f"alone_{n}"), threads)
        assert f"alone_{n}" in names(store)  # durable when the write returns
    assert threads == [SERVING] * 3


async def test_writes_at_once_go_to_the_writers_batches_and_all_land(store: Store) -> None:
    threads: list[int] = []
    async with trio.open_nursery() as nursery:
        for n in range(20):
            nursery.start_soon(store.write, create_org_noting_thread, org(f"many_{n}"), threads)
    assert len(threads) == 20
    assert any(thread != SERVING for thread in threads)  # the writer batched the rest
    assert {f"many_{n}" for n in range(20)} <= names(store)


async def test_a_write_lock_held_by_another_process_leaves_the_serving_thread_free(
    store: Store,
) -> None:
    other = sqlite3.connect(store.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another worker's transaction
    threads: list[int] = []
    done = trio.Event()

    async def write() -> None:
        await store.write(create_org_noting_thread, org("waited"), threads)
        done.set()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(write)
            # every task waits (the write for the writer's thread): none is stuck in a lock
            await trio.testing.wait_all_tasks_blocked()
            assert not done.is_set()
            other.execute("COMMIT")
    finally:
        other.close()
    assert threads and threads[-1] != SERVING
    assert "waited" in names(store)


async def test_an_operations_error_is_its_callers_and_nothing_of_it_lands(store: Store) -> None:
    with pytest.raises(ValueError, match="own failure"):
        await store.write(failing, org("half"))
    await store.write(records.create_org, org("after"))
    assert "half" not in names(store) and "after" in names(store)


async def test_slow_commits_keep_every_write_on_the_writer(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "HERE_COMMIT_S", 0.0)  # every commit is "slow"
    threads: list[int] = []
    await store.write(create_org_noting_thread, org("slow"), threads)
    assert threads and threads[0] != SERVING
