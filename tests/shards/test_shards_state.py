"""Admission and settlement rules of one shard, table by table (spec: "Limits",
"What a failed call counts against spend caps").

Charter: synchronous tests against :class:`shards.state.ShardState` with a
:class:`~shards.FakeClock`; no trio, no sleeps. Rows mirror the spec's tables.
Money in nano-USD; ``USD`` is one dollar.
"""

from __future__ import annotations

import copy
import logging
import pickle
from typing import Any

import pytest

from shards import (
    NANOS_PER_USD,
    AdmitRequest,
    FakeClock,
    KeyRef,
    KeyStatusRequest,
    NonDecreasingClock,
    Reservation,
    ReserveRefusal,
    ReserveRequest,
    SettleRequest,
    day_resets_at,
    minute_resets_at,
    month_resets_at,
    month_window,
    seconds_until_minute_reset,
)
from shards.org import OrgBook
from shards.state import ShardState

USD = NANOS_PER_USD
ORG = "org_1"
FAMILY = "fam_1"
PARENT = "key_parent"
CHILD = "key_child"


class World:
    """One shard, its org book and a fake clock, with terse helpers."""

    def __init__(self, clock: FakeClock | None = None, platform_rpm: int | None = None) -> None:
        self.clock = clock or FakeClock.at(2026, 3, 10, 10, 0, 0)
        self.orgs = OrgBook(platform_rpm)
        self.state = ShardState(NonDecreasingClock(self.clock), self.orgs)
        #: reservation id → the key that made it (a settle names its key)
        self.reserved_by: dict[int, str] = {}
        self.set_org(credits=1_000 * USD)

    def set_org(self, credits: int, budget: int | None = None, billed: int = 0) -> None:
        month = month_window(self.clock.now())
        self.orgs.set_org(ORG, credits, budget, billed, month)

    def ref(self, key: str) -> KeyRef:
        return self.state.key_ref(key, FAMILY)

    def key(self, key: str) -> dict[str, Any]:
        """The message fields that name ``key``."""
        ref = self.ref(key)
        return {"shard": ref.shard, "key": ref.state}

    def admit(self, key: str = PARENT, **kw: Any) -> Any:
        kw = {"rpm": 60, "max_in_flight": 20, **kw}
        return self.state.admit(AdmitRequest(**self.key(key), org_id=ORG, **kw))

    def reserve(self, key: str = PARENT, **kw: Any) -> Reservation | ReserveRefusal:
        kw = {"tokens": 10, "cost": 1 * USD, "org_cost": 1 * USD, **kw}
        if key == CHILD:
            kw.setdefault("parent", self.ref(PARENT).state)
        outcome = self.state.reserve(ReserveRequest(**self.key(key), org_id=ORG, **kw))
        if isinstance(outcome, Reservation):
            self.reserved_by[outcome.id] = key
        return outcome

    def settle(self, res: Reservation | None, cap: int = 0, billed: int = 0, **kw: Any) -> None:
        key = self.reserved_by[res.id] if res is not None else kw.pop("key", PARENT)
        self.state.settle(
            SettleRequest(
                **self.key(key),
                reservation=res,
                cap_amount=cap,
                billed_amount=billed,
                **kw,
            )
        )

    def status(self, key: str = PARENT, **kw: Any) -> Any:
        kw = {"rpm": 60, "tpm": None, "max_in_flight": 20, "usd_day": None, "usd_month": None}
        return self.state.status(KeyStatusRequest(**self.key(key), **kw))

    def spend(self, key: str) -> tuple[int, int, int, int]:
        """(day posted, day pending, month posted, month pending) as a reader sees them."""
        s = self.status(key)
        return (s.day.spent, s.day.reserved, s.month.spent, s.month.reserved)

    def org(self) -> tuple[int, int, int, int]:
        """(debited, pending, month billed, month pending) of the org."""
        o = self.orgs.get(ORG)
        return (o.debited, o.pending, o.month_billed, o.month_pending)


def reserved(outcome: Reservation | ReserveRefusal) -> Reservation:
    assert isinstance(outcome, Reservation), outcome
    return outcome


# --------------------------------------------------------------------- windows


@pytest.mark.parametrize(
    ("when", "minute_reset", "retry_after", "day_reset", "month_reset"),
    [
        # 2026-03-10T10:00:00Z: a minute has just begun
        ((2026, 3, 10, 10, 0, 0), (2026, 3, 10, 10, 1, 0), 60, (2026, 3, 11), (2026, 4, 1)),
        # 10:00:59.5: half a second left, rounded up
        ((2026, 3, 10, 10, 0, 59.5), (2026, 3, 10, 10, 1, 0), 1, (2026, 3, 11), (2026, 4, 1)),
        ((2026, 3, 10, 10, 0, 30.5), (2026, 3, 10, 10, 1, 0), 30, (2026, 3, 11), (2026, 4, 1)),
        # the last second of a year
        ((2026, 12, 31, 23, 59, 59), (2027, 1, 1, 0, 0, 0), 1, (2027, 1, 1), (2027, 1, 1)),
        # leap day
        ((2028, 2, 29, 12, 0, 0), (2028, 2, 29, 12, 1, 0), 60, (2028, 3, 1), (2028, 3, 1)),
    ],
)
def test_window_resets(
    when: tuple[Any, ...],
    minute_reset: tuple[int, ...],
    retry_after: int,
    day_reset: tuple[int, ...],
    month_reset: tuple[int, ...],
) -> None:
    t = FakeClock.at(*when).now()
    assert minute_resets_at(t) == FakeClock.at(*minute_reset).now()
    assert seconds_until_minute_reset(t) == retry_after
    assert day_resets_at(t) == FakeClock.at(*day_reset).now()
    assert month_resets_at(t) == FakeClock.at(*month_reset).now()


def test_fake_clock_only_advances_and_pool_time_never_goes_back() -> None:
    clock = FakeClock.at(2026, 3, 10, 10, 0, 0)
    with pytest.raises(ValueError):
        clock.advance(-1)
    seen = NonDecreasingClock(clock)
    assert seen.now() == clock.now()
    clock.set(clock.now() - 3600)  # an operator steps the wall clock back an hour
    assert seen.now() == clock.now() + 3600


# --------------------------------------------------------------------- step 3


@pytest.mark.parametrize(
    ("rpm", "calls", "expected_ok", "expected_remaining"),
    [
        (1, 1, [True], [0]),
        (2, 4, [True, True, False, False], [1, 0, 0, 0]),
        (3, 5, [True, True, True, False, False], [2, 1, 0, 0, 0]),
        (0, 2, [False, False], [0, 0]),
    ],
)
def test_rpm_counts_every_request_refused_ones_included(
    rpm: int, calls: int, expected_ok: list[bool], expected_remaining: list[int]
) -> None:
    w = World()
    results = [w.admit(rpm=rpm, take_slot=False) for _ in range(calls)]
    assert [r.ok for r in results] == expected_ok
    assert [r.remaining_requests for r in results] == expected_remaining
    for r in results:
        assert r.limit_requests == rpm
        if not r.ok:
            assert (r.code, r.scope, r.retry_after) == ("rate_limited", "key", 60)
    assert w.status().requests_this_minute == calls


@pytest.mark.parametrize(
    ("start", "step_s", "second_ok"),
    [
        ((2026, 3, 10, 10, 0, 59), 1, True),  # 10:00:59 → 10:01:00: a new window
        ((2026, 3, 10, 10, 0, 0), 59, False),  # 10:00:00 → 10:00:59: the same window
        ((2026, 3, 10, 10, 0, 59.9), 0.1, True),
        ((2026, 3, 10, 23, 59, 59), 1, True),  # across midnight too
    ],
)
def test_minute_window_is_the_clock_minute(
    start: tuple[Any, ...], step_s: float, second_ok: bool
) -> None:
    w = World(FakeClock.at(*start))
    first = w.admit(rpm=1)
    assert first.ok
    w.clock.advance(step_s)
    second = w.admit(rpm=1)
    assert second.ok is second_ok
    if not second_ok:
        assert second.retry_after == seconds_until_minute_reset(w.clock.now())
        assert second.reset_requests_s == second.retry_after


@pytest.mark.parametrize(
    ("org_rpm", "platform_rpm", "third_scope"),
    [(2, None, "org"), (None, 2, "platform"), (2, 2, "org"), (None, None, None)],
)
def test_org_and_platform_windows(
    org_rpm: int | None, platform_rpm: int | None, third_scope: str | None
) -> None:
    w = World(platform_rpm=platform_rpm)
    a = w.admit(key="k1", org_rpm=org_rpm)
    b = w.admit(key="k2", org_rpm=org_rpm)
    c = w.admit(key="k3", org_rpm=org_rpm)
    assert a.ok and b.ok
    if third_scope is None:
        assert c.ok
    else:
        assert (c.ok, c.code, c.scope, c.retry_after) == (False, "rate_limited", third_scope, 60)
        assert not c.slot_taken
        assert w.status("k3").in_flight == 0
        assert w.status("k3").requests_this_minute == 1  # still counted for the key


def test_requests_refused_by_the_key_are_not_counted_by_the_org() -> None:
    w = World()
    assert w.admit(key="k1", rpm=1).ok
    assert not w.admit(key="k1", rpm=1).ok
    assert w.orgs.get(ORG).requests == 1


def test_in_flight_slot_taken_released_and_reads_pass() -> None:
    w = World()
    first = w.admit(max_in_flight=1)
    assert first.ok and first.slot_taken
    refused = w.admit(max_in_flight=1)
    assert (refused.ok, refused.code, refused.retry_after) == (False, "too_many_in_flight", 5)
    read = w.admit(max_in_flight=1, take_slot=False)  # GET /v1/key at the limit
    assert read.ok and not read.slot_taken
    assert w.status().in_flight == 1
    w.settle(None, slot_taken=True)
    assert w.status().in_flight == 0
    assert w.admit(max_in_flight=1).ok


# --------------------------------------------------------------------- step 8


def test_tpm_counts_tokens_even_when_refused() -> None:
    w = World(FakeClock.at(2026, 3, 10, 10, 0, 20))
    assert isinstance(w.reserve(tokens=60, tpm=100), Reservation)
    refused = w.reserve(tokens=60, tpm=100)
    assert isinstance(refused, ReserveRefusal)
    assert (refused.code, refused.limit, refused.retry_after) == ("rate_limited", "tpm", 40)
    assert isinstance(w.reserve(tokens=1, tpm=100), ReserveRefusal)  # 121 > 100
    assert w.status().tokens_this_minute == 121
    assert w.spend(PARENT) == (0, 1 * USD, 0, 1 * USD)  # only the first is pending
    w.clock.advance(40)  # 10:01:00
    assert isinstance(w.reserve(tokens=100, tpm=100), Reservation)


CAP_ROWS = [
    # (key caps, parent caps, spent by key / by parent beforehand, cost, expected)
    ({"key_usd_day": 10 * USD}, {}, (9 * USD, 9 * USD), 1 * USD, None),
    ({"key_usd_day": 10 * USD}, {}, (9 * USD, 9 * USD), 2 * USD, ("key", "usd_day")),
    ({"key_usd_month": 10 * USD}, {}, (9 * USD, 9 * USD), 2 * USD, ("key", "usd_month")),
    ({}, {"parent_usd_day": 10 * USD}, (1 * USD, 9 * USD), 2 * USD, ("parent", "usd_day")),
    ({}, {"parent_usd_month": 10 * USD}, (1 * USD, 9 * USD), 2 * USD, ("parent", "usd_month")),
    ({"key_usd_day": 5 * USD}, {"parent_usd_day": 5 * USD}, (0, 4 * USD), 1 * USD, None),
    (
        {"key_usd_day": 5 * USD},
        {"parent_usd_day": 5 * USD},
        (0, 4 * USD),
        2 * USD,
        ("parent", "usd_day"),
    ),
    ({}, {}, (10**6 * USD, 10**6 * USD), 1 * USD, None),  # no caps: unlimited
]


@pytest.mark.parametrize(("key_caps", "parent_caps", "spent", "cost", "expected"), CAP_ROWS)
def test_spend_caps_on_key_and_parent(
    key_caps: dict[str, int],
    parent_caps: dict[str, int],
    spent: tuple[int, int],
    cost: int,
    expected: tuple[str, str] | None,
) -> None:
    w = World()
    w.state.load_spend(CHILD, FAMILY, spent[0], spent[0])
    w.state.load_spend(PARENT, FAMILY, spent[1], spent[1])  # a parent's figure includes the child's
    outcome = w.reserve(CHILD, cost=cost, org_cost=0, **key_caps, **parent_caps)
    if expected is None:
        res = reserved(outcome)
        assert (res.key_nanos, res.parent_nanos) == (cost, cost)
        assert w.spend(CHILD) == (spent[0], cost, spent[0], cost)
        assert w.spend(PARENT) == (spent[1], cost, spent[1], cost)
    else:
        assert isinstance(outcome, ReserveRefusal)
        assert (outcome.code, outcome.scope, outcome.limit) == ("key_cap_exceeded", *expected)
        assert w.spend(CHILD) == (spent[0], 0, spent[0], 0)
        assert w.spend(PARENT) == (spent[1], 0, spent[1], 0)


def test_counters_stay_in_64_bits_an_uncapped_key_meets_the_64_bit_ceiling() -> None:
    """Key states are arrays of 64-bit ints: nothing may be admitted that they cannot
    count, and a refusal changes nothing (no half-applied reservation)."""
    w = World()
    w.set_org(credits=0)
    huge = 2**62
    first = reserved(w.reserve(CHILD, cost=huge, org_cost=0, check_credits=False))
    second = w.reserve(CHILD, cost=huge, org_cost=0, check_credits=False)  # 2**63 > max
    assert isinstance(second, ReserveRefusal)
    assert (second.code, second.scope, second.limit) == ("key_cap_exceeded", "key", "usd_day")
    assert w.spend(CHILD) == (0, huge, 0, huge) and w.spend(PARENT) == (0, huge, 0, huge)
    w.settle(first, cap=huge)
    assert w.spend(CHILD) == (huge, 0, huge, 0)
    # the token window saturates; the tpm check still sees the true count
    assert isinstance(w.reserve(tokens=2**63, cost=0, org_cost=0), Reservation)
    refused = w.reserve(tokens=2**63, cost=0, org_cost=0, tpm=10**15)
    assert isinstance(refused, ReserveRefusal) and refused.limit == "tpm"
    assert w.status().tokens_this_minute == 2**63 - 1


def test_pending_counts_against_caps() -> None:
    w = World()
    reserved(w.reserve(cost=6 * USD, key_usd_day=10 * USD))
    refused = w.reserve(cost=6 * USD, key_usd_day=10 * USD)
    assert isinstance(refused, ReserveRefusal) and refused.code == "key_cap_exceeded"


@pytest.mark.parametrize(
    ("credits", "budget", "billed", "org_cost", "check_credits", "expected"),
    [
        (10 * USD, None, 0, 10 * USD, True, None),
        (10 * USD, None, 0, 11 * USD, True, "insufficient_credits"),
        (10 * USD, None, 0, 11 * USD, False, None),  # not checked (e.g. sandbox)
        (100 * USD, 10 * USD, 8 * USD, 2 * USD, True, None),
        (100 * USD, 10 * USD, 8 * USD, 3 * USD, True, "budget_exceeded"),
        (100 * USD, 10 * USD, 8 * USD, 3 * USD, False, "budget_exceeded"),
        (1 * USD, 10 * USD, 8 * USD, 3 * USD, True, "insufficient_credits"),  # credits first
        (0, None, 0, 0, True, None),  # sandbox: nothing billed, nothing to check
    ],
)
def test_org_credits_and_budget(
    credits: int,
    budget: int | None,
    billed: int,
    org_cost: int,
    check_credits: bool,
    expected: str | None,
) -> None:
    w = World()
    w.set_org(credits=credits, budget=budget, billed=billed)
    outcome = w.reserve(cost=org_cost, org_cost=org_cost, check_credits=check_credits)
    if expected is None:
        assert reserved(outcome).org_nanos == org_cost
        assert w.org() == (0, org_cost, billed, org_cost)
    else:
        assert isinstance(outcome, ReserveRefusal)
        assert (outcome.code, outcome.scope) == (expected, "org")
        assert w.org() == (0, 0, billed, 0)


@pytest.mark.parametrize(
    ("refusing", "caps"),
    [
        ("parent", {"parent_usd_day": 1 * USD}),
        ("credits", {}),
        ("budget", {}),
    ],
)
def test_all_or_nothing_refusal_leaves_nothing_pending(refusing: str, caps: dict[str, int]) -> None:
    w = World()
    if refusing == "credits":
        w.set_org(credits=1 * USD)
    if refusing == "budget":
        w.set_org(credits=100 * USD, budget=1 * USD)
    outcome = w.reserve(CHILD, cost=2 * USD, org_cost=2 * USD, key_usd_day=100 * USD, **caps)
    assert isinstance(outcome, ReserveRefusal)
    assert w.spend(CHILD) == (0, 0, 0, 0)
    assert w.spend(PARENT) == (0, 0, 0, 0)
    assert w.org() == (0, 0, 0, 0)
    assert w.state.pending == {}
    assert w.status(CHILD).tokens_this_minute == 10  # tokens stay counted


# -------------------------------------------------------------------- step 10


@pytest.mark.parametrize(
    ("cap", "billed", "posted", "debited"),
    [
        (3 * USD, 3 * USD, 3 * USD, 3 * USD),  # provider reported usage
        (2 * USD, 0, 2 * USD, 0),  # no usage reported: caps only, no credits
        (0, 0, 0, 0),  # void
        (5 * USD, 5 * USD, 5 * USD, 5 * USD),  # the full reserved estimate
        (9 * USD, 7 * USD, 5 * USD, 5 * USD),  # over the reservation: clamped
    ],
)
def test_settle_posts_and_releases(cap: int, billed: int, posted: int, debited: int) -> None:
    w = World()
    res = reserved(w.reserve(CHILD, cost=5 * USD, org_cost=5 * USD))
    w.settle(res, cap, billed)
    assert w.spend(CHILD) == (posted, 0, posted, 0)
    assert w.spend(PARENT) == (posted, 0, posted, 0)
    assert w.org() == (debited, 0, debited, 0)
    snap = w.orgs.snapshot(ORG, res.month, 0)
    assert (snap.balance, snap.reserved, snap.used) == (1_000 * USD - debited, 0, debited)


def test_settle_exactly_once() -> None:
    w = World()
    res = reserved(w.reserve(CHILD, cost=5 * USD, org_cost=5 * USD))
    w.settle(res, 2 * USD, 2 * USD)
    w.settle(res, 2 * USD, 2 * USD)
    w.settle(res, 0, 0)  # a late void changes nothing either
    assert w.spend(CHILD) == (2 * USD, 0, 2 * USD, 0)
    assert w.spend(PARENT) == (2 * USD, 0, 2 * USD, 0)
    assert w.org() == (2 * USD, 0, 2 * USD, 0)


def test_a_retried_settle_releases_the_slot_once(caplog: pytest.LogCaptureFixture) -> None:
    w = World()
    assert w.admit(max_in_flight=2).slot_taken  # call A
    assert w.admit(max_in_flight=2).slot_taken  # call B
    res = reserved(w.reserve())
    with caplog.at_level(logging.DEBUG, logger="shards"):
        for _ in range(3):  # call A settles, then retries its settlement
            w.settle(res, 1 * USD, 1 * USD, slot_taken=True)
    assert w.status().in_flight == 1  # call B still holds its slot
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not w.admit(max_in_flight=2, take_slot=False).slot_taken
    assert w.admit(max_in_flight=2).slot_taken
    assert not w.admit(max_in_flight=2).ok


def test_settle_over_reservation_is_clamped_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    w = World()
    res = reserved(w.reserve(cost=1 * USD, org_cost=1 * USD))
    with caplog.at_level(logging.WARNING, logger="shards"):
        w.settle(res, 2 * USD, 2 * USD)
    assert w.spend(PARENT) == (1 * USD, 0, 1 * USD, 0)
    assert any("clamped" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("reserve_at", "settle_at", "day_after", "month_after", "org_month_after"),
    [
        # same day: everything posts
        ((2026, 3, 10, 12), (2026, 3, 10, 13), (3, 0), (3, 0), 3),
        # across midnight UTC: the day window is new, the month is the same
        ((2026, 3, 10, 23, 59, 59), (2026, 3, 11, 0, 0, 1), (0, 0), (3, 0), 3),
        # across the 1st: day and month are new, nothing lands in them
        ((2026, 3, 31, 23, 59, 59), (2026, 4, 1, 0, 0, 1), (0, 0), (0, 0), 0),
    ],
)
def test_window_rollover_between_reserve_and_settle(
    reserve_at: tuple[Any, ...],
    settle_at: tuple[Any, ...],
    day_after: tuple[int, int],
    month_after: tuple[int, int],
    org_month_after: int,
) -> None:
    w = World(FakeClock.at(*reserve_at))
    res = reserved(w.reserve(CHILD, cost=5 * USD, org_cost=5 * USD))
    w.clock.set(FakeClock.at(*settle_at).now())
    w.settle(res, 3 * USD, 3 * USD)
    expected = (day_after[0] * USD, day_after[1], month_after[0] * USD, month_after[1])
    assert w.spend(CHILD) == expected
    assert w.spend(PARENT) == expected
    debited, pending, month_billed, month_pending = w.org()
    assert (debited, pending) == (3 * USD, 0)  # credits are debited whatever the window
    assert (month_billed, month_pending) == (org_month_after * USD, 0)
    assert w.state.pending == {}


@pytest.mark.parametrize(
    ("start", "step", "day_spent", "month_spent"),
    [
        ((2026, 3, 10, 23, 59, 59), 1, 0, 4),  # midnight UTC resets the day only
        ((2026, 1, 31, 23, 59, 59), 1, 0, 0),  # the 1st resets the month
        ((2026, 3, 10, 0, 0, 0), 86_399, 4, 4),  # 23:59:59 the same day
    ],
)
def test_day_and_month_windows_reset(
    start: tuple[Any, ...], step: int, day_spent: int, month_spent: int
) -> None:
    w = World(FakeClock.at(*start))
    w.settle(reserved(w.reserve(cost=4 * USD)), 4 * USD, 0)
    w.clock.advance(step)
    status = w.status()
    assert (status.day.spent, status.month.spent) == (day_spent * USD, month_spent * USD)
    assert status.day.resets_at == day_resets_at(w.clock.now())
    assert status.month.resets_at == month_resets_at(w.clock.now())


def test_status_remaining_is_never_negative_and_none_when_unlimited() -> None:
    w = World()
    w.state.load_spend(PARENT, FAMILY, 12 * USD, 12 * USD)
    s = w.state.status(
        KeyStatusRequest(
            **w.key(PARENT),
            rpm=60,
            tpm=None,
            max_in_flight=20,
            usd_day=10 * USD,
            usd_month=None,
        )
    )
    assert (s.day.spent, s.day.limit, s.day.remaining) == (12 * USD, 10 * USD, 0)
    assert (s.month.limit, s.month.remaining) == (None, None)


def test_status_counts_nothing() -> None:
    w = World()
    w.admit()
    before = w.ref(PARENT).state.tolist()
    status = w.status()
    assert (status.requests_this_minute, status.in_flight, status.day.spent) == (1, 1, 0)
    assert w.ref(PARENT).state.tolist() == before
    fresh = w.status("never_seen")
    assert (fresh.requests_this_minute, fresh.in_flight, fresh.day.spent) == (0, 0, 0)


def test_a_key_ref_is_one_per_key_and_stays_in_its_family() -> None:
    w = World()
    ref = w.ref(PARENT)
    assert w.ref(PARENT) is ref and (ref.key_id, ref.family_id, ref.shard) == (PARENT, FAMILY, 0)
    with pytest.raises(ValueError, match="family"):
        w.state.key_ref(PARENT, "another_family")
    with pytest.raises(ValueError, match="own parent"):
        w.reserve(CHILD, parent=w.ref(CHILD).state)


# ------------------------------------------------------------------ messages


def test_messages_are_frozen_keyword_only_with_defaults() -> None:
    req = AdmitRequest(shard=0, key="k", org_id="o", rpm=1, max_in_flight=1)  # type: ignore[arg-type]
    assert (req.take_slot, req.org_rpm) == (True, None)
    with pytest.raises(AttributeError):
        req.rpm = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        AdmitRequest(0, "k", "o", 1, 1)  # type: ignore[misc]
    with pytest.raises(TypeError):
        AdmitRequest(shard=0, key="k", org_id="o", rpm=1)  # type: ignore[call-arg]
    assert req._replace(rpm=5) == AdmitRequest(
        shard=0,
        key="k",  # type: ignore[arg-type]
        org_id="o",
        rpm=5,
        max_in_flight=1,
    )
    assert not hasattr(req, "__dict__")
    assert copy.deepcopy(req) == req and pickle.loads(pickle.dumps(req)) == req


@pytest.mark.parametrize(
    ("cls", "fields"),
    [
        (AdmitRequest, {"shard": 1, "key": "k", "org_id": "o", "rpm": 2, "max_in_flight": 3}),
        (
            Reservation,
            {"id": 1, "org_id": "o", "tokens": 2, "key_nanos": 3, "parent_nanos": 4}
            | {"org_nanos": 5, "day": 6, "month": 7},
        ),
        (ReserveRefusal, {"code": "rate_limited", "scope": "key", "limit": "tpm"}),
    ],
)
def test_build_is_the_keyword_only_constructor(cls: Any, fields: dict[str, Any]) -> None:
    built = cls.build(**fields)
    assert type(built) is cls and built == cls(**fields)
    assert built._asdict() == {**cls._field_defaults, **fields}
    with pytest.raises(TypeError):
        cls.build(*fields.values())
    with pytest.raises(TypeError):
        cls.build(**fields, unknown=1)
