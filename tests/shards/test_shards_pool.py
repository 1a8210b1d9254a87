"""The shard pool as the gateway uses it: routing, timeouts, supervision, settlement.

Charter: every test runs the real pool (no mocks). Tests that wait out a timeout
run under trio's autojump ``MockClock``, so a 2-second reply timeout passes
instantly and nothing sleeps; the wall clock of the windows is a
:class:`~shards.FakeClock`. Faults are real: a message the
handler cannot process, a shard whose actor is not running, a caller cancelled
mid-call. Two tests reach into private attributes, named where they do.
"""

from __future__ import annotations

import ast
import logging
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from shards import (
    NANOS_PER_USD,
    AdmitRequest,
    FakeClock,
    KeyStatus,
    Reservation,
    ReserveRefusal,
    ReserveRequest,
    SettleRequest,
    ShardPool,
    ShardUnavailable,
    shard_index,
)
from shards.keys import DAY_POSTED

USD = NANOS_PER_USD
SHARDS_DIR = Path(__file__).resolve().parents[2] / "shards"


@pytest.fixture
def wall() -> FakeClock:
    return FakeClock.at(2026, 3, 10, 10, 0, 0)


@pytest.fixture
async def pool(wall: FakeClock) -> AsyncIterator[ShardPool]:
    pool = ShardPool(n_shards=4, clock=wall)
    pool.set_org("org", 100 * USD, None)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        yield pool
        nursery.cancel_scope.cancel()


def key(pool: ShardPool, key: str = "k1", family: str = "f1") -> dict[str, Any]:
    """The message fields that name a key (its shard and state)."""
    ref = pool.key_ref(key, family)
    return {"shard": ref.shard, "key": ref.state}


def admit_req(pool: ShardPool, key_id: str = "k1", family: str = "f1", **kw: Any) -> AdmitRequest:
    kw = {"rpm": 60, "max_in_flight": 20, **kw}
    return AdmitRequest(**key(pool, key_id, family), org_id="org", **kw)


def reserve_req(
    pool: ShardPool, key_id: str = "k1", family: str = "f1", parent: str | None = None, **kw: Any
) -> ReserveRequest:
    kw = {"tokens": 10, "cost": 1 * USD, "org_cost": 1 * USD, **kw}
    return ReserveRequest(
        **key(pool, key_id, family),
        parent=pool.key_ref(parent, family).state if parent else None,
        org_id="org",
        **kw,
    )


def settle_req(
    pool: ShardPool,
    res: Reservation | None,
    cap: int = 0,
    *,
    slot: bool = False,
    key_id: str = "k1",
    family: str = "f1",
) -> SettleRequest:
    return SettleRequest(
        **key(pool, key_id, family),
        slot_taken=slot,
        reservation=res,
        cap_amount=cap,
        billed_amount=cap,
    )


def status(pool: ShardPool, key: str = "k1", family: str = "f1") -> KeyStatus:
    return pool.key_status_nowait(
        pool.key_ref(key, family),
        rpm=60,
        tpm=None,
        max_in_flight=20,
        usd_day=None,
        usd_month=None,
    )


# -------------------------------------------------------------------- routing

# crc32 of the family id, mod 16: fixed forever (a balancer and restarts rely on it)
ROUTES = {"fam_a": 0, "fam_b": 10, "Zx9kQ2": 3, "": 0, "été": 4}


@pytest.mark.processes
def test_routing_is_stable_and_not_pythons_hash() -> None:
    assert {f: shard_index(f, 16) for f in ROUTES} == ROUTES
    assert {f: ShardPool(16).shard_index(f) for f in ROUTES} == ROUTES
    # another process, another hash seed: the same shards
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from shards import shard_index;"
        "print([shard_index(f, 16) for f in sys.argv[2:]])"
    )
    for seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", code, str(SHARDS_DIR.parent), *ROUTES],
            env={"PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert out.strip() == str(list(ROUTES.values()))


async def test_parent_and_sub_key_share_the_family_shard(pool: ShardPool) -> None:
    res = await pool.reserve(
        reserve_req(pool, "child", "fam_x", parent="parent", parent_usd_day=1 * USD)
    )
    assert isinstance(res, Reservation)
    refused = await pool.reserve(
        reserve_req(pool, "child2", "fam_x", parent="parent", parent_usd_day=1 * USD)
    )
    assert isinstance(refused, ReserveRefusal) and refused.scope == "parent"
    keys = pool.statistics().keys_per_shard
    assert keys[pool.shard_index("fam_x")] == 3 and sum(keys) == 3


def test_a_key_resolves_to_one_ref_on_its_family_shard(wall: FakeClock) -> None:
    pool = ShardPool(n_shards=4, clock=wall)
    ref = pool.key_ref("k1", "f1")
    assert pool.key_ref("k1", "f1") is ref and ref.shard == pool.shard_index("f1")
    pool.load_spend("k1", "f1", 3, 4)  # the same key: the same state
    assert ref.state[DAY_POSTED] == 3
    assert [len(shard.state.keys) for shard in pool._shards].count(1) == 1


# ----------------------------------------------------------- the request walk


async def test_walk_admit_reserve_settle(pool: ShardPool) -> None:
    adm = await pool.admit(admit_req(pool))
    assert adm.ok and adm.slot_taken
    res = await pool.reserve(reserve_req(pool, cost=5 * USD, org_cost=5 * USD))
    assert isinstance(res, Reservation)
    assert pool.org_snapshot("org").reserved == 5 * USD
    await pool.settle(settle_req(pool, res, 2 * USD, slot=True))
    s = await pool.key_status(
        pool.key_ref("k1", "f1"), rpm=60, tpm=None, max_in_flight=20, usd_day=None, usd_month=None
    )
    assert (s.in_flight, s.day.spent, s.day.reserved, s.requests_this_minute) == (
        0,
        2 * USD,
        0,
        1,
    )
    snap = pool.org_snapshot("org")
    assert (snap.balance, snap.reserved, snap.used) == (98 * USD, 0, 2 * USD)
    stats = pool.statistics()
    assert stats.running and stats.handled == 4 and stats.failed == 0
    assert stats.pending_reservations == (0, 0, 0, 0)


async def test_key_status_takes_no_slot_and_counts_nothing(pool: ShardPool) -> None:
    for _ in range(3):
        await pool.key_status(
            pool.key_ref("k1", "f1"), rpm=1, tpm=None, max_in_flight=1, usd_day=None, usd_month=None
        )
    assert (status(pool).requests_this_minute, status(pool).in_flight) == (0, 0)
    assert (await pool.admit(admit_req(pool, rpm=1, max_in_flight=1))).ok


async def test_load_spend_counts_against_caps(pool: ShardPool) -> None:
    pool.load_spend("k1", "f1", 9 * USD, 20 * USD)
    refused = await pool.reserve(reserve_req(pool, cost=2 * USD, key_usd_day=10 * USD))
    assert isinstance(refused, ReserveRefusal) and refused.limit == "usd_day"
    assert (status(pool).day.spent, status(pool).month.spent) == (9 * USD, 20 * USD)


async def test_org_credits_can_be_topped_up(pool: ShardPool) -> None:
    pool.set_org("poor", 1 * USD, None)
    req = reserve_req(pool, org_cost=2 * USD)._replace(org_id="poor")
    refused = await pool.reserve(req)
    assert isinstance(refused, ReserveRefusal) and refused.code == "insufficient_credits"
    assert pool.add_org_credits("poor", 1 * USD) == 2 * USD
    assert isinstance(await pool.reserve(req), Reservation)


# ----------------------------------------------- timeouts leave no effect behind


async def test_caller_that_times_out_leaves_no_effect(
    wall: FakeClock, autojump_clock: trio.testing.MockClock
) -> None:
    pool = ShardPool(n_shards=2, clock=wall, reply_timeout_s=2.0)
    pool.set_org("org", 100 * USD, None)
    # No actor is running yet: the message waits in the mailbox, the caller gives up.
    start = trio.current_time()
    with pytest.raises(ShardUnavailable):
        await pool.admit(admit_req(pool))
    with pytest.raises(ShardUnavailable):
        await pool.reserve(reserve_req(pool))
    assert trio.current_time() - start == pytest.approx(4.0)
    assert sum(pool.statistics().queue_lengths) == 2
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        await trio.testing.wait_all_tasks_blocked()
        stats = pool.statistics()
        assert (stats.abandoned, stats.handled, sum(stats.queue_lengths)) == (2, 0, 0)
        s = status(pool)
        assert (s.requests_this_minute, s.in_flight, s.tokens_this_minute) == (0, 0, 0)
        assert s.day.reserved == 0 and pool.org_snapshot("org").reserved == 0
        assert (await pool.admit(admit_req(pool))).ok  # and the shard serves on
        nursery.cancel_scope.cancel()


async def test_watchdog_bounds_the_wait_while_the_pool_runs(
    wall: FakeClock, autojump_clock: trio.testing.MockClock
) -> None:
    pool = ShardPool(n_shards=1, clock=wall, reply_timeout_s=2.0)
    async with trio.open_nursery() as nursery:
        # Private: start only the watchdog, as if the actor were stuck behind a backlog.
        await nursery.start(pool._watchdog.run)
        start = trio.current_time()
        with pytest.raises(ShardUnavailable):
            await pool.admit(admit_req(pool))
        waited = trio.current_time() - start
        assert 2.0 <= waited <= 2.5 + 1e-9
        assert pool.statistics().timed_out == 1
        await nursery.start(pool._shards[0].run)  # private: the actor comes back
        await trio.testing.wait_all_tasks_blocked()
        assert pool.statistics().abandoned == 1
        assert status(pool).requests_this_minute == 0 and status(pool).in_flight == 0
        nursery.cancel_scope.cancel()


async def test_cancelled_caller_abandons_its_message(pool: ShardPool) -> None:
    with trio.CancelScope() as scope:
        scope.cancel()  # the client went away before the shard answered
        await pool.admit(admit_req(pool))
    assert scope.cancelled_caught
    await trio.testing.wait_all_tasks_blocked()
    assert pool.statistics().abandoned == 1
    assert status(pool).requests_this_minute == 0 and status(pool).in_flight == 0


async def test_full_mailbox_is_back_pressure_then_unavailable(
    wall: FakeClock, autojump_clock: trio.testing.MockClock
) -> None:
    pool = ShardPool(n_shards=1, clock=wall, queue_size=1, reply_timeout_s=1.0)
    with pytest.raises(ShardUnavailable):
        await pool.admit(admit_req(pool))  # queued, then abandoned
    with pytest.raises(ShardUnavailable, match="mailbox full"):
        await pool.admit(admit_req(pool))  # never queued
    assert pool.statistics().queue_lengths == (1,)


async def test_tiny_mailbox_many_callers_every_walk_completes(wall: FakeClock) -> None:
    """The actor sleeps on its own wake-up and counts what senders counted: with a
    mailbox of 2 and 60 callers, most sends wait for room (where a sender's count lags
    behind the buffer). Every walk must complete, none time out, and the shard must end
    idle with nothing left counted, held or pending."""
    pool = ShardPool(n_shards=2, clock=wall, queue_size=2, reply_timeout_s=30.0)
    pool.set_org("org", 10**6 * USD, None)
    families = ["f1", "f2", "f3", "f4"]
    walks = 0

    async def caller(n: int) -> None:
        nonlocal walks
        for i in range(25):
            family = families[(n + i) % 4]
            key = f"{family}/k{n % 8}"
            admission = await pool.admit(admit_req(pool, key, family, rpm=10**6))
            assert admission.ok
            res = await pool.reserve(reserve_req(pool, key, family, cost=1_000, org_cost=1_000))
            assert isinstance(res, Reservation)
            await pool.settle(settle_req(pool, res, 1_000, slot=True, key_id=key, family=family))
            walks += 1

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            async with trio.open_nursery() as callers:
                for n in range(60):
                    callers.start_soon(caller, n)
            await trio.testing.wait_all_tasks_blocked()
            stats = pool.statistics()
            shards = pool._shards  # private: the count the actors sleep on
            nursery.cancel_scope.cancel()
    assert walks == 60 * 25
    assert (stats.handled, stats.timed_out, stats.failed) == (3 * walks, 0, 0)
    assert stats.queue_lengths == (0, 0) and stats.pending_reservations == (0, 0)
    assert [shard.queued for shard in shards] == [0, 0]
    in_flight = [status(pool, f"{f}/k{k}", f).in_flight for k in range(8) for f in families]
    assert set(in_flight) == {0}
    assert pool.org_snapshot("org").used == walks * 1_000


# ------------------------------------------------------------------ supervision


async def test_failing_message_answers_unavailable_and_the_actor_serves_on(
    pool: ShardPool, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="shards"):
        with pytest.raises(ShardUnavailable):
            await pool.admit(admit_req(pool, rpm=None))  # the handler raises TypeError
        with pytest.raises(ShardUnavailable):
            await pool.reserve(reserve_req(pool, cost=-1))  # the handler raises ValueError
    assert [r.name for r in caplog.records] == ["shards", "shards"]
    assert caplog.records[0].exc_info is not None
    assert (await pool.admit(admit_req(pool))).ok
    stats = pool.statistics()
    assert (stats.failed, stats.handled, stats.running) == (2, 1, True)


async def test_a_dead_actor_loop_takes_the_pool_down(wall: FakeClock) -> None:
    pool = ShardPool(n_shards=2, clock=wall)
    with pytest.RaisesGroup(AttributeError, flatten_subgroups=True):
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            # private: a mailbox item that is no reply slot breaks the actor's own loop
            # (not a handler, whose errors go back to the caller) once a call wakes it
            pool._shards[pool.shard_index("f1")].send_channel.send_nowait(None)  # type: ignore[arg-type]
            with pytest.raises(ShardUnavailable):  # the stopping actor answers its queue
                await pool.admit(admit_req(pool))
            await trio.sleep_forever()


# ------------------------------------------------------------------ settlement


async def test_settle_is_delivered_when_the_caller_is_cancelled(pool: ShardPool) -> None:
    res = await pool.reserve(reserve_req(pool, cost=5 * USD, org_cost=5 * USD))
    assert isinstance(res, Reservation)
    with trio.CancelScope() as scope:
        scope.cancel()  # the client disconnected before the settlement
        await pool.settle(settle_req(pool, res, 3 * USD))
        await trio.lowlevel.checkpoint()  # the cancellation lands after the settlement
    assert scope.cancelled_caught
    assert (status(pool).day.spent, status(pool).day.reserved) == (3 * USD, 0)
    assert pool.org_snapshot("org").used == 3 * USD


async def test_settle_survives_cancellation_while_queued(
    wall: FakeClock, autojump_clock: trio.testing.MockClock
) -> None:
    pool = ShardPool(n_shards=1, clock=wall, reply_timeout_s=2.0)
    pool.set_org("org", 100 * USD, None)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        res = await pool.reserve(reserve_req(pool, cost=5 * USD, org_cost=5 * USD))
        assert isinstance(res, Reservation)
        nursery.cancel_scope.cancel()
    # The shard is stopped: the settlement waits in its mailbox, the client leaves.
    client = trio.CancelScope()
    outcome: list[str] = []

    async def settle_then_disconnect() -> None:
        with client:
            try:
                await pool.settle(settle_req(pool, res, 4 * USD))
                outcome.append("confirmed")
            except ShardUnavailable:
                outcome.append("unconfirmed")
        outcome.append(f"cancelled_caught={client.cancelled_caught}")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(settle_then_disconnect)
        await trio.sleep(0.5)
        client.cancel()
        await trio.sleep(1.0)
        assert outcome == []  # still waiting, shielded from the cancellation
    # the wait for the reply is bounded (2 s)...
    assert outcome == ["unconfirmed", "cancelled_caught=False"]
    assert status(pool).day.reserved == 5 * USD
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        await trio.testing.wait_all_tasks_blocked()
        s = status(pool)
        assert (s.day.spent, s.day.reserved) == (4 * USD, 0)  # ...yet it is applied
        assert pool.org_snapshot("org").reserved == 0
        nursery.cancel_scope.cancel()


async def test_settle_twice_through_the_pool_counts_once(pool: ShardPool) -> None:
    res = await pool.reserve(reserve_req(pool, cost=5 * USD, org_cost=5 * USD))
    assert isinstance(res, Reservation)
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(pool.settle, settle_req(pool, res, 2 * USD))
    assert status(pool).day.spent == 2 * USD
    assert pool.org_snapshot("org").used == 2 * USD


# ------------------------------------------------------------------- layering


def test_shards_imports_only_stdlib_and_trio() -> None:
    allowed = set(sys.stdlib_module_names) | {"trio", "outcome"}
    for path in sorted(SHARDS_DIR.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                roots = [(node.module or "").split(".")[0]]
            else:
                continue
            for root in roots:
                assert root in allowed, f"{path.name} imports {root}"
