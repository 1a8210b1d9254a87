"""The store's interface on both backends: batched writes, the same rows and the same order.

Each test runs on SQLite and on PostgreSQL (``both_stores``): the operations are written
once, so what one backend answers the other must answer too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.store import Store, StoreError, claims, records, webhooks
from gateway.store import sql as sq
from gateway.store.migrations import MIGRATIONS
from tests.conftest import db_for

pytestmark = pytest.mark.both_stores

DAY, MONTH = "2026-11-22", "2026-11"


def request_row(request_id: str, **values: Any) -> dict[str, Any]:
    row = {
        "id": request_id,
        "key_id": "key_a",
        "parent_id": None,
        "org_id": "org_a",
        "created": 1.0,
        "day": DAY,
        "month": MONTH,
        "endpoint": "chat",
        "model": "m",
        "provider": "mock",
        "status": records.PENDING,
        "stream": 0,
        "tags": {},
        "usage": None,
        "estimated_usd_nanos": 10,
        "reserved_usd_nanos": 10,
        "settled_usd_nanos": 0,
        "billed_usd_nanos": 0,
        "mode": "live",
    }
    return {**row, **values}


@pytest.fixture
def store(tmp_path: Path) -> Any:
    store = Store(db_for(tmp_path))
    yield store
    store.close()


async def test_one_failing_write_does_not_undo_its_batch(store: Store) -> None:
    outcomes: dict[str, Any] = {}

    async def write(name: str, row: dict[str, Any]) -> None:
        try:
            await store.write(records.open_call, row, None)
            outcomes[name] = "ok"
        except Exception as exc:
            outcomes[name] = exc

    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.run)
        async with trio.open_nursery() as writers:  # queued together: one batch
            writers.start_soon(write, "first", request_row("req_1"))
            writers.start_soon(write, "clash", request_row("req_1"))
            writers.start_soon(write, "third", request_row("req_3"))
        ids = [row["id"] for row in await store.read(sq.query, "SELECT id FROM requests")]
        nursery.cancel_scope.cancel()
    # whichever of the two same-id writes came second failed alone (the op's own error)
    same = [outcomes["first"], outcomes["clash"]]
    assert same.count("ok") == 1 and outcomes["third"] == "ok", outcomes
    (error,) = [outcome for outcome in same if outcome != "ok"]
    assert isinstance(error, Exception) and not isinstance(error, StoreError)
    assert sorted(ids) == ["req_1", "req_3"]


def test_usage_groups_and_orders_alike(store: Store) -> None:
    """Tag groups in byte order (upper case first), the untagged group first; token
    counts read out of the usage JSON; pending rows not counted."""
    usage = {"prompt_tokens": 3, "completion_tokens": 4}
    for n, team in enumerate(["b", "B", None, "a", "b"]):
        tags = {"team": team} if team else {}
        row = request_row(f"req_{n}", tags=tags, usage=usage, status="succeeded")
        store.call(records.open_call, {**row, "settled_usd_nanos": n}, None)
    store.call(records.open_call, request_row("req_pending", tags={"team": "a"}), None)
    rows = store.call(records.usage_rows, ["key_a"], DAY, DAY, "tag:team")
    assert [(r["grp"], r["requests"], r["settled"]) for r in rows] == [
        (None, 1, 2),
        ("B", 1, 1),
        ("a", 1, 3),
        ("b", 2, 4),
    ]
    assert {(r["input_tokens"], r["output_tokens"]) for r in rows} >= {(6, 8), (3, 4)}
    (total,) = store.call(records.usage_rows, ["key_a"], DAY, DAY, None)
    assert (total["requests"], total["settled"], total["input_tokens"]) == (5, 10, 15)
    assert store.call(records.settled_spend, DAY, MONTH) == [
        {"key_id": "key_a", "parent_id": None, "day_nanos": 10, "month_nanos": 10}
    ]


def test_recovery_and_idempotency_claims(store: Store) -> None:
    claim = {
        "key_id": "key_a",
        "idem_key": "k1",
        "body_hash": "h",
        "request_id": "req_1",
        "state": claims.RUNNING,
        "stream": 0,
        "status": None,
        "headers": None,
        "body": None,
        "created_at": 5.0,
    }
    store.call(records.open_call, request_row("req_1"), claim)
    assert store.call(records.recover_pending) == {"calls": 1, "nanos": 10}
    row = store.call(records.get_request, "req_1", "key_a")
    assert (row["status"], row["settled_usd_nanos"], row["http_status"]) == (
        records.INTERRUPTED,
        10,
        503,
    )
    assert store.call(claims.get, "key_a", "k1")["state"] == claims.INTERRUPTED
    # a live claim holds its key: another attempt's claim reads it back, writing nothing
    other = {**claim, "request_id": "req_2", "created_at": 6.0}
    assert store.call(claims.claim, other)["request_id"] == "req_1"
    assert store.call(records.open_call, request_row("req_2"), other)["request_id"] == "req_1"
    assert store.call(records.get_request, "req_2", "key_a") is None
    # a claim past its retention is taken over, and settled by its own call only
    later = {**claim, "request_id": "req_3", "created_at": 5.0 + claims.RETENTION_S + 1}
    assert store.call(claims.claim, later) is None
    outcome = {"state": "done", "status": 200, "body": b"\x00{}", "headers": {"a": 1}}
    store.call(claims.settle, "key_a", "k1", "req_1", outcome)
    assert store.call(claims.get, "key_a", "k1")["state"] == claims.RUNNING
    store.call(claims.settle, "key_a", "k1", "req_3", outcome)
    again = store.call(claims.get, "key_a", "k1")
    assert (again["state"], again["body"], again["headers"]) == ("done", b"\x00{}", {"a": 1})
    assert store.call(claims.purge, later["created_at"] + 1) == 1


def test_the_schema_is_at_the_last_migration_after_a_reopen(tmp_path: Path) -> None:
    for _ in range(2):
        store = Store(db_for(tmp_path))
        try:
            versions = store.call(sq.query, "SELECT version FROM schema_migrations")
        finally:
            store.close()
        assert sorted(row["version"] for row in versions) == list(range(1, len(MIGRATIONS) + 1))


async def test_readiness_and_the_commit_hook(store: Store) -> None:
    """The operations' hooks (issue 20) on either backend: the store answers a readiness
    probe while its writer runs, and each committed batch reports its duration."""
    commits: list[float] = []
    store.on_commit = commits.append
    assert not await store.answers(1.0)  # no writer yet
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        assert await store.answers(1.0)
        await store.write(records.open_call, request_row("req_hook"), None)
        assert len(commits) == 1 and commits[0] >= 0
        assert await store.read(webhooks.undelivered_count) == 0
        nursery.cancel_scope.cancel()
