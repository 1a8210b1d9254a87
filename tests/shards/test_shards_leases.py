"""Leases at the shard level (issue 22): a shard admits against its pool's lease book,
answers LeaseShort (with the refusal it would give) when a lease cannot cover a step,
takes nothing and counts nothing then, and gives back what a settlement did not post.

The last tests play several nodes against one model of the database's grant (the sum
of leases and spend never above a limit) and check the caps hold exactly.
"""

from __future__ import annotations

import random
from typing import Any

from shards import (
    AdmitRequest,
    FakeClock,
    LeaseBook,
    LeaseShort,
    Reservation,
    ReserveRefusal,
    ReserveRequest,
    SettleRequest,
    lease_size,
)
from shards.clock import NonDecreasingClock
from shards.org import OrgBook
from shards.state import ShardState
from shards.windows import day_window, month_window

USD = 1_000_000_000
ORG = "org_1"


class Node:
    """One node: a shard with a lease book of its own."""

    def __init__(self, clock: FakeClock, name: str = "n1") -> None:
        self.name = name
        self.clock = clock
        self.orgs = OrgBook()
        self.orgs.set_org(ORG, 1_000 * USD, None, 0, month_window(clock.now()))
        self.state = ShardState(NonDecreasingClock(clock), self.orgs)
        self.book = self.state.leases = LeaseBook()

    def key(self, key_id: str) -> dict[str, Any]:
        ref = self.state.key_ref(key_id, "fam")
        return {"shard": 0, "key": ref.state, "key_id": key_id}

    def admit(self, key_id: str = "k1", **kw: Any) -> Any:
        kw = {"rpm": 60, "max_in_flight": 20, **kw}
        return self.state.admit(AdmitRequest(**self.key(key_id), org_id=ORG, **kw))

    def reserve(self, key_id: str = "k1", **kw: Any) -> Any:
        kw = {"tokens": 10, "cost": USD, "org_cost": USD, "check_credits": False, **kw}
        return self.state.reserve(ReserveRequest(**self.key(key_id), org_id=ORG, **kw))

    def settle(self, key_id: str, res: Reservation | None, cap: int = 0, **kw: Any) -> None:
        self.state.settle(SettleRequest(**self.key(key_id), reservation=res, cap_amount=cap, **kw))


def clock() -> FakeClock:
    return FakeClock.at(2026, 3, 10, 10, 0, 0)


def test_an_admission_without_leases_is_short_and_counts_nothing() -> None:
    node = Node(clock())
    verdict = node.admit(org_rpm=100)
    assert isinstance(verdict, LeaseShort)
    assert [n.kind for n in verdict.needs] == ["r", "o", "s"]
    assert [(r.code, r.scope) for r in verdict.refusals] == [
        ("rate_limited", "key"),
        ("rate_limited", "org"),
        ("too_many_in_flight", "key"),
    ]
    now = node.clock.now()
    for need in verdict.needs:
        node.book.grant(need.limit_id, need.amount, now)
    admission = node.admit(org_rpm=100)
    assert admission.ok and admission.remaining_requests == 59  # counted once, not twice
    assert all(node.book.balance[n.limit_id] == 0 for n in verdict.needs)
    node.settle("k1", None, slot_taken=True)
    assert node.book.balance["s:k1:0"] == 1  # the slot went back to the lease


def test_reserve_short_names_the_refusal_of_each_limit() -> None:
    node = Node(clock())
    verdict = node.reserve(
        "child",
        parent=node.key("parent")["key"],
        parent_id="parent",
        key_usd_day=10 * USD,
        parent_usd_month=10 * USD,
        tpm=1000,
        check_credits=True,
    )
    assert isinstance(verdict, LeaseShort)
    pairs = zip(verdict.needs, verdict.refusals, strict=True)
    got = {n.kind: (r.code, r.scope, r.limit) for n, r in pairs}
    assert got == {
        "t": ("rate_limited", "key", "tpm"),
        "d": ("key_cap_exceeded", "key", "usd_day"),
        "m": ("key_cap_exceeded", "parent", "usd_month"),
        "c": ("insufficient_credits", "org", "credits"),
    }
    day = day_window(node.clock.now())
    assert {n.limit_id for n in verdict.needs} >= {f"d:child:{day}", "c:org_1:0"}


def test_a_settlement_gives_back_what_it_did_not_post() -> None:
    node = Node(clock())
    short = node.reserve(key_usd_day=10 * USD)
    assert isinstance(short, LeaseShort)
    (need,) = short.needs
    node.book.grant(need.limit_id, 3 * USD, node.clock.now())
    res = node.reserve(key_usd_day=10 * USD)
    assert isinstance(res, Reservation)
    assert node.book.balance[need.limit_id] == 2 * USD
    node.settle("k1", res, cap=USD // 4)
    assert node.book.balance[need.limit_id] == 2 * USD + 3 * USD // 4
    node.settle("k1", res, cap=USD // 4)  # a duplicate settle gives nothing back
    assert node.book.balance[need.limit_id] == 2 * USD + 3 * USD // 4


def test_a_local_refusal_takes_no_lease() -> None:
    node = Node(clock())
    for need in node.reserve(key_usd_day=USD // 2).needs:
        node.book.grant(need.limit_id, USD, node.clock.now())
    refusal = node.reserve(key_usd_day=USD // 2)  # the shard's own cap check refuses
    assert isinstance(refusal, ReserveRefusal) and refusal.code == "key_cap_exceeded"
    assert sum(node.book.balance.values()) == USD


def test_with_leases_the_credits_are_the_leases_not_this_nodes_view() -> None:
    """Credits bought through another node: this node's view of the balance (0 here)
    predates them, the database's grant does not; the credits lease decides."""
    node = Node(clock())
    node.orgs.set_org(ORG, 0, None, 0, month_window(node.clock.now()))
    short = node.reserve(check_credits=True)
    assert isinstance(short, LeaseShort)
    assert [n.kind for n in short.needs] == ["c"]
    node.book.grant(short.needs[0].limit_id, USD, node.clock.now())
    assert isinstance(node.reserve(check_credits=True), Reservation)
    short = node.reserve(check_credits=True)  # the lease is spent: short again, not admitted
    assert isinstance(short, LeaseShort)


def test_lease_size() -> None:
    assert lease_size(headroom=100, deficit=10, nodes=3, unit=10) == 10  # 100 // 6 = 16 → 10
    assert lease_size(headroom=1000, deficit=10, nodes=3, unit=10) == 160
    assert lease_size(headroom=9, deficit=10, nodes=3, unit=10) == 0  # never a partial slice
    assert lease_size(headroom=10, deficit=10, nodes=3, unit=10) == 10
    assert lease_size(headroom=10, deficit=4, nodes=1, unit=10) == 4  # a node's own remainder
    # the node's waiting calls want 7 in all: one refill for them, within the headroom
    assert lease_size(headroom=12, deficit=1, nodes=3, unit=1, wanted=7) == 7
    assert lease_size(headroom=5, deficit=1, nodes=3, unit=1, wanted=7) == 5
    assert lease_size(headroom=0, deficit=1, nodes=3, unit=1, wanted=7) == 0


class Database:
    """The database's side of one limit, as ``gateway/store/node_leases.py`` keeps it:
    spend posted plus every node's lease never above the limit."""

    def __init__(self, limit: int, nodes: int) -> None:
        self.limit, self.nodes = limit, nodes
        self.posted = 0
        self.leases: dict[str, int] = {}

    def refill(self, node: str, deficit: int, unit: int) -> int:
        headroom = self.limit - self.posted - sum(self.leases.values())
        grant = lease_size(headroom, deficit, self.nodes, unit)
        self.leases[node] = self.leases.get(node, 0) + grant
        return grant

    def settle(self, node: str, posted: int) -> None:
        self.leases[node] -= posted
        self.posted += posted

    def give_back(self, node: str, amount: int) -> None:
        self.leases[node] -= amount


def run_cluster(seed: int, k: int, calls: int) -> tuple[int, Database]:
    """``calls`` reservations of one unit spread at random over three nodes against a
    daily cap of k units and a half; half of them settle (at a random part) as they go."""
    rng = random.Random(seed)
    c = clock()
    nodes = [Node(c, f"n{i}") for i in range(3)]
    unit = 1000
    db = Database(k * unit + unit // 2, len(nodes))
    admitted, held = 0, []
    for _ in range(calls):
        node = rng.choice(nodes)
        verdict = node.reserve(cost=unit, key_usd_day=db.limit)
        if isinstance(verdict, LeaseShort):
            (need,) = verdict.needs
            grant = db.refill(node.name, need.amount, unit)
            if grant < need.amount:
                db.give_back(node.name, grant)
                continue
            node.book.grant(need.limit_id, grant, c.now())
            verdict = node.reserve(cost=unit, key_usd_day=db.limit)
        assert isinstance(verdict, Reservation), verdict
        admitted += 1
        held.append((node, verdict))
        if rng.random() < 0.5:
            settled_by, res = held.pop(rng.randrange(len(held)))
            posted = rng.randrange(unit + 1)
            settled_by.settle("k1", res, cap=posted)
            db.settle(settled_by.name, posted)
        pending = sum(r.key_nanos for _, r in held)
        assert db.posted + pending <= db.limit
        assert db.posted + sum(db.leases.values()) <= db.limit
    return admitted, db


def test_three_nodes_never_pass_a_cap_together() -> None:
    for seed in range(20):
        admitted, _ = run_cluster(seed, k=7, calls=200)
        assert admitted >= 7


def test_three_nodes_admit_exactly_k_when_nothing_settles() -> None:
    """Near the cap a node leases exactly what a call needs, so no headroom is stranded:
    with every reservation held, exactly k of a cap of k and a half units are admitted."""
    c = clock()
    nodes = [Node(c, f"n{i}") for i in range(3)]
    unit, k = 1000, 25
    db = Database(k * unit + unit // 2, 3)
    admitted = 0
    for i in range(300):
        node = nodes[i % 3]
        verdict = node.reserve(cost=unit, key_usd_day=db.limit)
        if isinstance(verdict, LeaseShort):
            (need,) = verdict.needs
            grant = db.refill(node.name, need.amount, unit)
            if not grant:
                continue
            node.book.grant(need.limit_id, grant, c.now())
            verdict = node.reserve(cost=unit, key_usd_day=db.limit)
        assert isinstance(verdict, Reservation)
        admitted += 1
    assert admitted == k
