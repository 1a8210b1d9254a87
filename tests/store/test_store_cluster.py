"""The database's side of leases (issue 22): registration, refills that never grant more
than a limit's headroom, settlements moving spend out of a lease, and the sweep of a
dead node (its pending rows recovered, its leases dropped, in one transaction).
The session's throwaway PostgreSQL (``pg_cluster``); a fresh database per test.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import trio

from gateway.store import Store, records
from gateway.store import node_leases as cl
from shards import LeaseNeed
from tests.support.pg_cluster import Cluster

_names = itertools.count()
DAY = 20_522  # 2026-03-10


@pytest.fixture
def store(pg_cluster: Cluster) -> Any:
    name = f"pgc_{next(_names)}"
    pg_cluster.psql(f"CREATE DATABASE {name}")
    s = Store(pg_cluster.url(name))
    yield s
    s.close()


def pending_row(request_id: str, node_id: str, reserved: int) -> dict[str, Any]:
    return {
        "id": request_id,
        "key_id": "k1",
        "org_id": "o1",
        "day": "2026-03-10",
        "month": "2026-03",
        "status": records.PENDING,
        "reserved_usd_nanos": reserved,
        "settled_usd_nanos": 0,
        "node_id": node_id,
    }


def need(amount: int, limit: int = 100) -> LeaseNeed:
    return LeaseNeed("d", "k1", DAY, amount, limit)


def test_a_live_node_id_is_held_and_an_expired_one_taken_over(store: Store) -> None:
    first = store.call(cl.register, "n1", 30.0)
    assert first.epoch and not first.held_s
    assert 29 < store.call(cl.register, "n1", 30.0).held_s <= 30
    store.call(cl.leave, "n1", first.epoch)
    again = store.call(cl.register, "n1", 30.0)
    assert again.epoch and again.epoch != first.epoch
    assert not store.call(cl.renew, "n1", first.epoch, 30.0)  # the old epoch is fenced
    assert store.call(cl.renew, "n1", again.epoch, 30.0)


def test_refills_never_grant_past_the_limit(store: Store) -> None:
    a = store.call(cl.register, "a", 30.0).epoch
    b = store.call(cl.register, "b", 30.0).epoch
    grants = []
    for node, epoch in itertools.islice(itertools.cycle([("a", a), ("b", b)]), 30):
        grants.append(store.call(cl.refill, node, epoch, need(10)))
    assert sum(grants) == 100  # every unit of 10 granted, none past the cap
    assert grants[-1] == 0
    # a settlement posting 4 of a's lease, and 6 given back: 10 more may be granted
    store.call(records.open_call, pending_row("r1", "a", 10), None)
    values = {"status": "ok", "settled_usd_nanos": 4}
    store.call(records.settle_call, "r1", values, None, None, None, ("a", [("d:k1:20522", 4)]))
    store.call(cl.give_back, "a", [("d:k1:20522", 6)])
    assert store.call(cl.refill, "b", b, need(10)) == 0  # 4 posted + 90 leased + 10 > 100
    assert store.call(cl.refill, "b", b, need(6)) == 6


def test_a_fenced_node_gets_nothing(store: Store) -> None:
    epoch = store.call(cl.register, "a", 30.0).epoch
    store.call(cl.leave, "a", epoch)
    with pytest.raises(cl.Fenced):
        store.call(cl.refill, "a", epoch, need(10))


def test_the_sweep_recovers_a_dead_nodes_rows_and_frees_its_leases(store: Store) -> None:
    a = store.call(cl.register, "a", 30.0).epoch
    b = store.call(cl.register, "b", 30.0).epoch
    assert store.call(cl.refill, "a", a, need(60)) == 60
    store.call(records.open_call, pending_row("r1", "a", 60), None)
    assert store.call(cl.refill, "b", b, need(50)) == 0
    store.call(cl.leave, "a", a)  # as if its registration expired
    found = store.call(cl.sweep, 0.0)
    assert (found["nodes"], found["calls"], found["nanos"]) == (1, 1, 60)
    # the dead node's reservation now counts as spend: 40 left, no more
    assert store.call(cl.refill, "b", b, need(50)) == 0
    assert store.call(cl.refill, "b", b, need(40)) == 40
    # a late settlement from the dead node changes nothing
    values = {"status": "ok", "settled_usd_nanos": 1}
    store.call(records.settle_call, "r1", values, None, None, None, ("a", [("d:k1:20522", 1)]))
    row = store.call(records.get_request, "r1", "k1")
    assert row["status"] == records.INTERRUPTED and row["settled_usd_nanos"] == 60


async def test_concurrent_refills_from_three_nodes_hold_the_limit(store: Store) -> None:
    """Refills on three connections at once: the advisory lock and the one-snapshot
    read keep the sum of grants within the limit."""
    url = store.path
    stores = [Store(url) for _ in range(3)]
    epochs = [s.call(cl.register, f"n{i}", 30.0).epoch for i, s in enumerate(stores)]
    granted = [0, 0, 0]

    async def node(i: int) -> None:
        for _ in range(20):
            granted[i] += await stores[i].transact(cl.refill, f"n{i}", epochs[i], need(3, 250))

    try:
        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(node, i)
    finally:
        for s in stores:
            s.close()
    assert sum(granted) <= 250
    assert sum(granted) >= 240  # only a remainder under one unit of 3... per node
