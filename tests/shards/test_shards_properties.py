"""Property: no interleaving of concurrent calls can overspend, and money is conserved.

Hypothesis draws a family (a parent key and two sub-keys), random caps, org credits
and budget, and a handful of concurrent "clients". Each client walks requests
through one real :class:`~shards.ShardPool`: admit (maybe taking a slot), reserve,
then settle for a random amount (sometimes above the reservation), void, or settle
the same reservation twice at once, with random pauses in between so the calls
interleave. After every step of every client, and at the end:

- for every key, the parent and the org: posted + pending ≤ limit (day and month
  caps, credits, monthly budget), and in-flight ≤ max_in_flight;
- at the end nothing is pending, no slot is held (none released twice), and what
  was posted equals the sum of the settlements (each clamped to its reservation,
  counted once, a retried settle included).

Charter: trio's ``MockClock`` with autojump drives the pauses (virtual time, no real
sleeping); the wall clock of the windows stays on one minute of one day.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from shards import (
    AdmitRequest,
    FakeClock,
    Reservation,
    ReserveRequest,
    SettleRequest,
    ShardPool,
)

ORG = "org"
FAMILY = "fam"
PARENT, CHILD_1, CHILD_2 = "parent", "child_1", "child_2"
KEYS = (PARENT, CHILD_1, CHILD_2)
UNIT = 1_000  # nano-USD; small numbers so caps are hit often


@dataclass(frozen=True)
class Caps:
    usd_day: int | None
    usd_month: int | None
    rpm: int
    max_in_flight: int


@dataclass(frozen=True)
class Op:
    key: str
    take_slot: bool
    cost: int
    org_cost: int
    #: "post" (amounts below), "void", "twice" (two concurrent settles), "over"
    resolution: str
    cap_amount: int
    billed_amount: int
    pause_before_settle: float


@dataclass(frozen=True)
class Scenario:
    caps: dict[str, Caps]
    credits: int
    budget: int | None
    billed_before: int
    check_credits: bool
    clients: list[list[tuple[float, Op]]]


@dataclass
class Ledger:
    """What the clients expect to see posted, from what they settled."""

    posted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KEYS, 0))
    billed: int = 0
    steps: int = 0


money = st.integers(min_value=0, max_value=30).map(lambda n: n * UNIT)
maybe_cap = st.none() | st.integers(min_value=0, max_value=60).map(lambda n: n * UNIT)
pause = st.sampled_from([0.0, 0.0, 0.001, 0.002, 0.005])


@st.composite
def ops(draw: st.DrawFn) -> Op:
    cost = draw(money)
    org_cost = draw(money)
    resolution = draw(st.sampled_from(["post", "post", "void", "twice", "over"]))
    if resolution == "over":
        cap_amount = cost + draw(st.integers(min_value=1, max_value=10)) * UNIT
        billed = org_cost + draw(st.integers(min_value=1, max_value=10)) * UNIT
    else:
        cap_amount = draw(st.integers(min_value=0, max_value=cost))
        billed = draw(st.integers(min_value=0, max_value=org_cost))
    return Op(
        key=draw(st.sampled_from(KEYS)),
        take_slot=draw(st.booleans()),
        cost=cost,
        org_cost=org_cost,
        resolution=resolution,
        cap_amount=0 if resolution == "void" else cap_amount,
        billed_amount=0 if resolution == "void" else billed,
        pause_before_settle=draw(pause),
    )


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    caps = {
        key: Caps(
            usd_day=draw(maybe_cap),
            usd_month=draw(maybe_cap),
            rpm=draw(st.integers(min_value=1, max_value=40)),
            max_in_flight=draw(st.integers(min_value=1, max_value=4)),
        )
        for key in KEYS
    }
    budget = draw(maybe_cap)
    billed_before = draw(st.integers(min_value=0, max_value=budget if budget is not None else 20))
    clients = draw(
        st.lists(st.lists(st.tuples(pause, ops()), min_size=1, max_size=6), min_size=1, max_size=8)
    )
    return Scenario(
        caps=caps,
        credits=draw(st.integers(min_value=0, max_value=80)) * UNIT,
        budget=budget,
        billed_before=billed_before,
        check_credits=draw(st.booleans()),
        clients=clients,
    )


def check_invariants(pool: ShardPool, sc: Scenario, ledger: Ledger) -> None:
    ledger.steps += 1
    for key in KEYS:
        caps = sc.caps[key]
        s = pool.key_status_nowait(
            pool.key_ref(key, FAMILY),
            rpm=caps.rpm,
            tpm=None,
            max_in_flight=caps.max_in_flight,
            usd_day=caps.usd_day,
            usd_month=caps.usd_month,
        )
        for window in (s.day, s.month):
            assert window.spent >= 0 and window.reserved >= 0, (key, window)
            if window.limit is not None:
                assert window.spent + window.reserved <= window.limit, (key, window)
        assert 0 <= s.in_flight <= caps.max_in_flight, (key, s)
    org = pool.org_snapshot(ORG)
    assert org.reserved >= 0 and org.month_reserved >= 0, org
    if sc.check_credits:
        assert org.used + org.reserved <= sc.credits, org
    if sc.budget is not None:
        assert org.month_billed + org.month_reserved <= sc.budget, org


async def client(
    pool: ShardPool, sc: Scenario, plan: list[tuple[float, Op]], ledger: Ledger
) -> None:
    for pause_before, op in plan:
        await trio.sleep(pause_before)
        caps = sc.caps[op.key]
        ref = pool.key_ref(op.key, FAMILY)
        admission = await pool.admit(
            AdmitRequest(
                shard=ref.shard,
                key=ref.state,
                org_id=ORG,
                rpm=caps.rpm,
                max_in_flight=caps.max_in_flight,
                take_slot=op.take_slot,
            )
        )
        check_invariants(pool, sc, ledger)
        if not admission.ok:
            continue
        parent = sc.caps[PARENT]
        is_child = op.key != PARENT
        outcome = await pool.reserve(
            ReserveRequest(
                shard=ref.shard,
                key=ref.state,
                parent=pool.key_ref(PARENT, FAMILY).state if is_child else None,
                org_id=ORG,
                tokens=1,
                cost=op.cost,
                key_usd_day=caps.usd_day,
                key_usd_month=caps.usd_month,
                parent_usd_day=parent.usd_day if is_child else None,
                parent_usd_month=parent.usd_month if is_child else None,
                org_cost=op.org_cost,
                check_credits=sc.check_credits,
            )
        )
        check_invariants(pool, sc, ledger)
        reservation = outcome if isinstance(outcome, Reservation) else None
        await trio.sleep(op.pause_before_settle)
        settle = SettleRequest(
            shard=ref.shard,
            key=ref.state,
            slot_taken=admission.slot_taken,
            reservation=reservation,
            cap_amount=op.cap_amount,
            billed_amount=op.billed_amount,
        )
        if op.resolution == "twice" and reservation is not None:
            async with trio.open_nursery() as nursery:  # a settle and its retry
                nursery.start_soon(pool.settle, settle)
                nursery.start_soon(pool.settle, settle)
        else:
            await pool.settle(settle)
        check_invariants(pool, sc, ledger)
        if reservation is not None:
            posted = min(op.cap_amount, reservation.key_nanos)
            ledger.posted[op.key] += posted
            if is_child:
                ledger.posted[PARENT] += posted
            ledger.billed += min(op.billed_amount, reservation.org_nanos)


class ErrorLog(logging.Handler):
    """Collects ERROR records of logger "shards" (e.g. a slot released twice)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def run_scenario(sc: Scenario) -> None:
    errors = ErrorLog()
    logging.getLogger("shards").addHandler(errors)
    try:
        await play(sc)
    finally:
        logging.getLogger("shards").removeHandler(errors)
    assert not errors.records, [r.getMessage() for r in errors.records]


async def play(sc: Scenario) -> None:
    pool = ShardPool(n_shards=3, clock=FakeClock.at(2026, 3, 10, 10, 0, 0))
    pool.set_org(ORG, sc.credits, sc.budget, sc.billed_before)
    ledger = Ledger()
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        async with trio.open_nursery() as clients:
            for plan in sc.clients:
                clients.start_soon(client, pool, sc, plan, ledger)
        check_invariants(pool, sc, ledger)
        for key in KEYS:
            caps = sc.caps[key]
            s = pool.key_status_nowait(
                pool.key_ref(key, FAMILY),
                rpm=caps.rpm,
                tpm=None,
                max_in_flight=caps.max_in_flight,
                usd_day=caps.usd_day,
                usd_month=caps.usd_month,
            )
            assert (s.day.reserved, s.month.reserved, s.in_flight) == (0, 0, 0), (key, s)
            assert s.day.spent == s.month.spent == ledger.posted[key], (key, s, ledger)
        org = pool.org_snapshot(ORG)
        assert (org.reserved, org.month_reserved) == (0, 0), org
        assert org.used == ledger.billed, (org, ledger)
        assert org.month_billed == sc.billed_before + ledger.billed, (org, ledger)
        assert org.balance == sc.credits - ledger.billed
        stats = pool.statistics()
        assert stats.pending_reservations == (0, 0, 0) and stats.failed == 0
        assert stats.timed_out == 0 and stats.abandoned == 0
        nursery.cancel_scope.cancel()


@settings(max_examples=120, deadline=None, report_multiple_bugs=False)
@given(sc=scenarios())
def test_no_interleaving_overspends_and_money_is_conserved(sc: Scenario) -> None:
    trio.run(run_scenario, sc, clock=trio.testing.MockClock(autojump_threshold=0))
