"""The lookup of a key this node does not hold (gateway/accounts/key_lookup.py), on a real store.

Two keyrings over one SQLite file stand for two nodes: ``made`` writes keys as the node
that creates them does, ``here`` meets their tokens first through its lookup. The store
is the real one; :class:`CountingStore` only counts the lookups' reads (and, where a test
needs lookups in progress, holds them until told). The lookup's clock is injected.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from gateway.accounts import key_record as k
from gateway.accounts.key_lookup import LOOKUPS_PER_ADDRESS, MISS_TTL_S, KeyLookup
from gateway.accounts.key_record import KeyRecord
from gateway.accounts.keyring import Keyring
from gateway.accounts.orgs import Org
from gateway.store import Store, records
from shards import ShardPool

ORG = "org_lookup"


class CountingStore(Store):
    """The real store; its reads of keys by prefix are counted (``reads``, and the
    prefixes they asked for: ``lookups``), and held while ``hold`` is set (lookups in
    progress at once)."""

    def __init__(self, db: str) -> None:
        super().__init__(db)
        self.reads = self.lookups = 0
        self.hold: trio.Event | None = None

    async def read(self, op: Any, *args: Any) -> Any:
        if op is records.keys_by_prefixes:
            self.reads += 1
            self.lookups += len(args[0])
            if self.hold is not None:
                await self.hold.wait()
        return await super().read(op, *args)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class TwoNodes:
    """``made``'s keys met first by ``here``'s lookup."""

    def __init__(self, store: CountingStore) -> None:
        self.store = store
        self.made = Keyring(store, ShardPool(n_shards=2).key_ref)
        self.pool = ShardPool(n_shards=2)
        self.here = Keyring(store, self.pool.key_ref)
        self.clock = Clock()
        self.orgs_asked: list[str] = []
        self.lookup = KeyLookup(store, self.here, self.know_org, clock=self.clock)

    async def know_org(self, org_id: str) -> None:
        self.orgs_asked.append(org_id)

    def key(self, **settings: Any) -> tuple[KeyRecord, str]:
        record, token = self.made.build(org_id=ORG, name="k", mode="live", **settings)
        self.made.insert_now(record)
        return record, token


@pytest.fixture
def node(tmp_path: Path) -> Iterator[TwoNodes]:
    store = CountingStore(str(tmp_path / "g.db"))
    store.call(records.create_org, Org(id=ORG, name="acme").to_row())
    yield TwoNodes(store)
    store.close()


def unknown_token(n: int = 0) -> str:
    return k.new_token("live", k.new_prefix(f"{n:06d}"))


async def test_a_key_made_elsewhere_is_found_and_learned_as_a_load_has_it(node: TwoNodes) -> None:
    record, token = node.key()
    found = await node.lookup.find(token)
    assert found is not None and found.id == record.id
    assert found.shard_ref == node.pool.key_ref(record.id, record.family_id)
    assert node.orgs_asked == [ORG]
    loaded = Keyring(node.store, ShardPool(n_shards=2).key_ref)
    loaded.load(node.store.call(records.all_keys))
    assert found == loaded.get(record.id)
    # held now: the next call is a hit of the keyring, no read
    assert node.here.authenticate(token) == found
    assert await node.lookup.find(token) is None and node.store.lookups == 1


async def test_a_sub_key_comes_with_its_parent_and_a_rotated_key_with_its_successor(
    node: TwoNodes,
) -> None:
    parent, _ = node.key()
    child, child_token = node.made.build(
        org_id=ORG, name="sub", mode="live", family_id=parent.family_id, parent_id=parent.id
    )
    node.made.insert_now(child)
    found = await node.lookup.find(child_token)
    assert found is not None and found.id == child.id
    assert node.here.get(parent.id) is not None

    old, old_token = node.key()
    async with trio.open_nursery() as nursery:  # the rotation is a write: the writer runs
        nursery.start_soon(node.store.run)
        new, _ = await node.made.rotate(old, grace_s=60)
        nursery.cancel_scope.cancel()
    found = await node.lookup.find(old_token)
    assert found is not None and found.rotated_to == new.id
    assert node.here.successor(found).id == new.id


async def test_a_revoked_key_or_a_sub_key_of_a_revoked_parent_is_not_let_in(
    node: TwoNodes,
) -> None:
    revoked, revoked_token = node.key(status="revoked")
    parent, _ = node.key(status="disabled")
    child, child_token = node.made.build(
        org_id=ORG, name="sub", mode="live", family_id=parent.family_id, parent_id=parent.id
    )
    node.made.insert_now(child)
    assert await node.lookup.find(revoked_token) is None
    assert await node.lookup.find(child_token) is None
    assert node.here.get(revoked.id) is not None  # learned, and refused as it is


async def test_no_read_for_a_malformed_token_or_a_held_prefix(node: TwoNodes) -> None:
    _, token = node.key()
    assert await node.lookup.find(token) is not None
    wrong = token[:-1] + ("a" if token[-1] != "a" else "b")
    assert await node.lookup.find(wrong) is None
    assert await node.lookup.find("svc_live_nope") is None
    assert node.store.lookups == 1


async def test_an_unknown_prefix_is_read_once_per_miss_ttl(node: TwoNodes) -> None:
    token = unknown_token()
    for _ in range(100):
        assert await node.lookup.find(token) is None
    assert node.store.lookups == 1
    node.clock.now += MISS_TTL_S / 2
    assert await node.lookup.find(token) is None
    assert node.store.lookups == 1
    node.clock.now += MISS_TTL_S / 2
    assert await node.lookup.find(token) is None
    assert node.store.lookups == 2


async def test_lookups_are_bounded_per_address_and_a_flood_spares_the_others(
    node: TwoNodes,
) -> None:
    """A stranger's flood of varied prefixes spends its own address's budget only: a new
    key used from another address is found at once (issue 50: a global budget was
    spent by the flood, and new keys were 401 until the next poll)."""
    for n in range(3 * LOOKUPS_PER_ADDRESS):
        assert await node.lookup.find(unknown_token(n), "stranger") is None
    assert node.store.lookups == LOOKUPS_PER_ADDRESS
    _, token = node.key()
    assert await node.lookup.find(token, "stranger") is None  # its budget is spent
    assert node.store.lookups == LOOKUPS_PER_ADDRESS
    assert await node.lookup.find(token, "client") is not None
    assert node.store.lookups == LOOKUPS_PER_ADDRESS + 1
    # the stranger's budget refills with time: half a second, half of it
    node.clock.now += 0.5
    for n in range(LOOKUPS_PER_ADDRESS):
        assert await node.lookup.find(unknown_token(1000 + n), "stranger") is None
    assert node.store.lookups == LOOKUPS_PER_ADDRESS + 1 + LOOKUPS_PER_ADDRESS // 2


async def test_many_new_keys_at_once_are_found_in_a_few_reads(node: TwoNodes) -> None:
    """20 keys made elsewhere, met at once (each 5 times): all found, in two reads at most (the
    first prefix's, then every one that arrived while it ran)."""
    node.store.hold = trio.Event()
    made = [node.key() for _ in range(20)]
    answers: list[KeyRecord | None] = []

    async def find(token: str) -> None:
        answers.append(await node.lookup.find(token, "client"))

    async with trio.open_nursery() as nursery:
        for _ in range(5):
            for _, token in made:
                nursery.start_soon(find, token)
        await trio.testing.wait_all_tasks_blocked()
        assert node.store.reads == 1  # the first prefix's read, held; the others wait
        node.store.hold.set()
    assert sorted(a.id for a in answers if a is not None) == sorted([r.id for r, _ in made] * 5)
    assert node.store.reads <= 2 and node.store.lookups == 20
