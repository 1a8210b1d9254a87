"""The admission state of one shard, and the synchronous steps that change it.

A :class:`ShardState` owns the :class:`KeyState` (resolved as a :class:`KeyRef`) of
every key whose family maps to its shard (a sub-key always sits beside its parent),
the reservations still pending there, and a reference to the pool-wide
:class:`~shards.org.OrgBook`. Its methods are plain synchronous functions: the shard
actor calls them one message at a time, and none of them awaits, so each
check-then-update is atomic under trio.

Admission (step 3, :meth:`ShardState.admit`)
--------------------------------------------
1. Count the request in the key's clock-minute window, always (refused ones too).
   Count > rpm → ``rate_limited`` (scope key), Retry-After = rest of the minute.
2. Count it in the org's and the platform's minute windows; over ``org_rpm`` or the
   platform rpm → ``rate_limited`` (scope org/platform), Retry-After 60.
3. A model call (``take_slot``) needs ``in_flight < max_in_flight``, else
   ``too_many_in_flight``, Retry-After 5; otherwise it takes the slot.

Reservation (step 8, :meth:`ShardState.reserve`)
------------------------------------------------
1. Add the worst-case tokens to the key's minute window, always; over tpm →
   ``rate_limited`` (the tokens stay counted, never corrected).
2. Check ``posted + pending + cost <= cap`` on the key's day and month windows,
   then the parent's day and month (a parent's windows hold the whole family's
   spend) → ``key_cap_exceeded``.
3. Check the org: credits (``debited + pending + org_cost <= credits``) when asked,
   then the monthly budget → ``insufficient_credits`` / ``budget_exceeded``.
4. Only when every check passed, add the pending amounts everywhere and record the
   :class:`~shards.messages.Reservation`. A refusal leaves nothing pending.

Settlement (step 10, :meth:`ShardState.settle`)
-----------------------------------------------
Release the slot, then resolve the reservation exactly once, like a two-phase
pending transfer: the pending amount leaves every account and ``cap_amount`` (key,
parent) / ``billed_amount`` (org) is posted; the rest is released. Zero and zero is
a void. The reservation is looked up by id and removed, so a second settle of the
same id changes nothing, its slot release included: retrying a settle is safe.
Posted amounts are clamped to what was reserved. If a day or month window rolled
over in between, that window's pending is already gone with the old window, and the
amount is not posted to the new one: spend belongs to the day (month) it was
reserved in.

Hence, for every key, parent and org, at every instant: posted + pending ≤ limit
(unless a limit was lowered, or spend loaded at start-up was already over it).
"""

from __future__ import annotations

import itertools
import logging

from .clock import Clock
from .keys import (
    DAY,
    DAY_PENDING,
    DAY_POSTED,
    IN_FLIGHT,
    INT64_MAX,
    MINUTE,
    MONTH,
    MONTH_PENDING,
    MONTH_POSTED,
    REQUESTS,
    TOKENS,
    KeyRef,
    KeyState,
    new_key_state,
    over_cap,
    resolve,
    roll_minute,
    roll_spend,
)
from .leases import LeaseBook, LeaseNeed, LeaseShort, admit_needs, posted, reserve_needs
from .messages import (
    BUDGET_EXCEEDED,
    INSUFFICIENT_CREDITS,
    KEY_CAP_EXCEEDED,
    RATE_LIMITED,
    TOO_MANY_IN_FLIGHT,
    Admission,
    AdmitCode,
    AdmitRequest,
    KeyStatus,
    KeyStatusRequest,
    Reservation,
    ReserveCode,
    ReserveRefusal,
    ReserveRequest,
    Scope,
    SettleRequest,
    SpendWindow,
)
from .org import OrgBook
from .windows import (
    DAY_S,
    MINUTE_S,
    month_of_day,
    month_resets_at,
    seconds_until_minute_reset,
)

__all__ = ["ShardState"]

logger = logging.getLogger("shards")

_ORG_RETRY_AFTER = 60
_IN_FLIGHT_RETRY_AFTER = 5


def _admission(
    rpm: int,
    remaining: int,
    reset: int,
    *,
    slot_taken: bool = False,
    code: AdmitCode | None = None,
    retry_after: int | None = None,
    scope: Scope | None = None,
) -> Admission:
    """An admission (``code`` None) or a refusal, with the key's rate-limit figures."""
    return Admission.build(
        ok=code is None,
        code=code,
        retry_after=retry_after,
        scope=scope,
        limit_requests=rpm,
        remaining_requests=remaining,
        reset_requests_s=reset,
        slot_taken=slot_taken,
    )


class ShardState:
    """All keys of one shard. Methods are synchronous: see the module docstring."""

    def __init__(
        self,
        clock: Clock,
        orgs: OrgBook,
        ids: itertools.count[int] | None = None,
        index: int = 0,
    ) -> None:
        self._clock = clock
        self.orgs = orgs
        #: this shard's index in its pool (what its keys' refs route by)
        self.index = index
        self.keys: dict[str, KeyRef] = {}
        #: reservation id → (reservation, its key's state, its parent's state), while
        #: pending: the settlement finds the states without looking them up again
        self.pending: dict[int, tuple[Reservation, KeyState, KeyState | None]] = {}
        self._ids = ids if ids is not None else itertools.count(1)
        #: the pool's leases when several nodes share the limits (else None)
        self.leases: LeaseBook | None = None

    def key_ref(self, key_id: str, family_id: str) -> KeyRef:
        """The key's ref, created (with a blank state) on first use.

        Synchronous: call it from the trio thread, like every change outside the
        actor (a blank state changes no admission).
        """
        ref = self.keys.get(key_id)
        if ref is None:
            ref = self.keys[key_id] = KeyRef(key_id, family_id, self.index, new_key_state())
        elif ref.family_id != family_id:
            raise ValueError(f"key {key_id!r} is of family {ref.family_id!r}, not {family_id!r}")
        return ref

    # -- step 3 -----------------------------------------------------------------

    def admit(self, req: AdmitRequest) -> Admission | LeaseShort:
        t = self._clock.now()
        minute = int(t // MINUTE_S)
        book, needs = self.leases, None
        if book is not None and req.key_id is not None:
            needs = admit_needs(req, minute, self.orgs.platform_rpm)
            if short := book.short(needs):
                return _admit_short(short, req.rpm, (minute + 1) * MINUTE_S - int(t))
        admission = self._admit(req, t, minute)
        if book is not None and needs is not None and admission.ok:
            book.take(needs, t)
        return admission

    def _admit(self, req: AdmitRequest, t: float, minute: int) -> Admission:
        key = req.key
        roll_minute(key, minute)
        key[REQUESTS] = count = key[REQUESTS] + 1
        rpm = req.rpm
        # seconds_until_minute_reset(t), inline on this hot path: ceil(end - t) is
        # end - floor(t) for t >= 0 (and at least 1, as t < end)
        reset = (minute + 1) * MINUTE_S - int(t)
        remaining = rpm - count if count < rpm else 0
        if count > rpm:
            return _admission(
                rpm, remaining, reset, code=RATE_LIMITED, retry_after=reset, scope="key"
            )
        org_count = self.orgs.get(req.org_id).count_request(minute)
        platform_count = self.orgs.count_platform_request(minute)
        scope: Scope | None = None
        if req.org_rpm is not None and org_count > req.org_rpm:
            scope = "org"
        elif (cap := self.orgs.platform_rpm) is not None and platform_count > cap:
            scope = "platform"
        if scope is not None:
            return _admission(
                rpm, remaining, reset, code=RATE_LIMITED, retry_after=_ORG_RETRY_AFTER, scope=scope
            )
        if req.take_slot:
            if key[IN_FLIGHT] >= req.max_in_flight:
                return _admission(
                    rpm,
                    remaining,
                    reset,
                    code=TOO_MANY_IN_FLIGHT,
                    retry_after=_IN_FLIGHT_RETRY_AFTER,
                    scope="key",
                )
            key[IN_FLIGHT] += 1
        return _admission(rpm, remaining, reset, slot_taken=req.take_slot)

    # -- step 8 -----------------------------------------------------------------

    def reserve(self, req: ReserveRequest) -> Reservation | ReserveRefusal | LeaseShort:
        cost, org_cost, tokens = req.cost, req.org_cost, req.tokens
        if cost < 0 or org_cost < 0 or tokens < 0:
            raise ValueError(f"negative amount in {req!r}")
        key, parent = req.key, req.parent
        if parent is key:
            raise ValueError("a key is its own parent")
        t = self._clock.now()
        book, needs = self.leases, None
        if book is not None and req.key_id is not None:
            needs = reserve_needs(req, t, self.orgs.get(req.org_id).budget)
            if short := book.short(needs):
                return _reserve_short(short, req.key_id, seconds_until_minute_reset(t))
        minute = int(t // MINUTE_S)
        roll_minute(key, minute)
        counted = key[TOKENS] + tokens
        key[TOKENS] = counted if counted < INT64_MAX else INT64_MAX
        if req.tpm is not None and counted > req.tpm:
            retry = seconds_until_minute_reset(t)
            return ReserveRefusal.build(
                code=RATE_LIMITED, scope="key", limit="tpm", retry_after=retry
            )
        day = int(t // DAY_S)
        month = month_of_day(day)
        roll_spend(key, day, month)
        if over := over_cap(key, cost, req.key_usd_day, req.key_usd_month):
            return ReserveRefusal.build(code=KEY_CAP_EXCEEDED, scope="key", limit=over)
        if parent is not None:
            roll_spend(parent, day, month)
            if over := over_cap(parent, cost, req.parent_usd_day, req.parent_usd_month):
                return ReserveRefusal.build(code=KEY_CAP_EXCEEDED, scope="parent", limit=over)
        org = self.orgs.get(req.org_id)
        org.roll_month(month)
        # with leases a cost's credits are the lease's (granted out of the database's
        # balance): this node's view of the balance may predate credits bought elsewhere
        credits_here = req.check_credits and (needs is None or not org_cost)
        if credits_here and org.debited + org.pending + org_cost > org.credits:
            return ReserveRefusal.build(code=INSUFFICIENT_CREDITS, scope="org", limit="credits")
        if org.budget is not None and org.month_billed + org.month_pending + org_cost > org.budget:
            return ReserveRefusal.build(code=BUDGET_EXCEEDED, scope="org", limit="budget_month")
        # Every check passed: from here on nothing can refuse.
        key[DAY_PENDING] += cost
        key[MONTH_PENDING] += cost
        if parent is not None:
            parent[DAY_PENDING] += cost
            parent[MONTH_PENDING] += cost
        org.pending += org_cost
        org.month_pending += org_cost
        if book is not None and needs is not None:
            book.take(needs, t)
        res = Reservation.build(
            id=next(self._ids),
            org_id=req.org_id,
            tokens=tokens,
            key_nanos=cost,
            parent_nanos=cost if parent is not None else 0,
            org_nanos=org_cost,
            day=day,
            month=month,
            leases=tuple(needs) if needs else (),
        )
        self.pending[res.id] = (res, key, parent)
        return res

    # -- step 10 ----------------------------------------------------------------

    def settle(self, req: SettleRequest) -> None:
        entry = None
        if req.reservation is not None:
            entry = self.pending.pop(req.reservation.id, None)
            if entry is None:  # a duplicate (a retried settle): slot included, no-op
                logger.debug("reservation %d already resolved", req.reservation.id)
                return
        if req.slot_taken:
            holder = req.key
            if holder[IN_FLIGHT] > 0:
                holder[IN_FLIGHT] -= 1
            else:
                logger.error("shard %d: settle released a slot its key did not hold", self.index)
            if self.leases is not None and req.key_id is not None:
                self.leases.give(f"s:{req.key_id}:0", 1)
        if entry is None:
            return
        res, key, parent = entry
        cap = _clamp(req.cap_amount, res.key_nanos, res, "cap_amount")
        billed = _clamp(req.billed_amount, res.org_nanos, res, "billed_amount")
        if res.leases and self.leases is not None:
            _give_back(self.leases, res.leases, cap, billed)
        t = self._clock.now()
        day = int(t // DAY_S)
        month = month_of_day(day)
        roll_spend(key, day, month)
        resolve(key, res.day, res.month, res.key_nanos, cap)
        if parent is not None:
            roll_spend(parent, day, month)
            resolve(parent, res.day, res.month, res.parent_nanos, cap)
        org = self.orgs.get(res.org_id)
        org.pending -= res.org_nanos
        org.debited += billed
        org.roll_month(month)
        if org.month == res.month:
            org.month_pending -= res.org_nanos
            org.month_billed += billed

    # -- reads and loading ------------------------------------------------------

    def status(self, req: KeyStatusRequest) -> KeyStatus:
        t = self._clock.now()
        minute = int(t // MINUTE_S)
        day = int(t // DAY_S)
        month = month_of_day(day)
        key = req.key
        fresh_minute = key[MINUTE] == minute
        return KeyStatus.build(
            day=_window(
                key[DAY_POSTED] if key[DAY] == day else 0,
                key[DAY_PENDING] if key[DAY] == day else 0,
                req.usd_day,
                (day + 1) * DAY_S,
            ),
            month=_window(
                key[MONTH_POSTED] if key[MONTH] == month else 0,
                key[MONTH_PENDING] if key[MONTH] == month else 0,
                req.usd_month,
                month_resets_at(t),
            ),
            rpm=req.rpm,
            requests_this_minute=key[REQUESTS] if fresh_minute else 0,
            tpm=req.tpm,
            tokens_this_minute=key[TOKENS] if fresh_minute else 0,
            max_in_flight=req.max_in_flight,
            in_flight=key[IN_FLIGHT],
            reset_requests_s=seconds_until_minute_reset(t),
        )

    def load_spend(self, key_id: str, family_id: str, day_spent: int, month_spent: int) -> None:
        """Set the posted spend of the current day and month (start-up rebuild)."""
        t = self._clock.now()
        day = int(t // DAY_S)
        key = self.key_ref(key_id, family_id).state
        roll_spend(key, day, month_of_day(day))
        key[DAY_POSTED] = day_spent
        key[MONTH_POSTED] = month_spent


def _give_back(book: LeaseBook, taken: tuple[LeaseNeed, ...], cap: int, billed: int) -> None:
    """A settled reservation's leases: the part of the spend not posted goes back (the
    posted part leaves the lease in the database, with the settlement)."""
    reserved = {need.limit_id: need.amount for need in taken}
    for limit_id, amount in posted(taken, cap, billed):
        book.give(limit_id, reserved[limit_id] - amount)


_ADMIT_SHORT: dict[str, Scope] = {"r": "key", "o": "org", "p": "platform"}


def _admit_short(short: tuple[LeaseNeed, ...], rpm: int, reset: int) -> LeaseShort:
    refusals = []
    code: AdmitCode
    scope: Scope
    for need in short:
        if need.kind == "s":
            code, retry, scope = TOO_MANY_IN_FLIGHT, _IN_FLIGHT_RETRY_AFTER, "key"
        else:
            scope = _ADMIT_SHORT[need.kind]
            code, retry = RATE_LIMITED, reset if scope == "key" else _ORG_RETRY_AFTER
        refusals.append(
            Admission.build(
                ok=False,
                code=code,
                retry_after=retry,
                scope=scope,
                limit_requests=rpm,
                remaining_requests=0,
                reset_requests_s=reset,
                slot_taken=False,
            )
        )
    return LeaseShort(short, tuple(refusals))


_RESERVE_SHORT: dict[str, tuple[ReserveCode, str]] = {
    "d": (KEY_CAP_EXCEEDED, "usd_day"),
    "m": (KEY_CAP_EXCEEDED, "usd_month"),
    "c": (INSUFFICIENT_CREDITS, "credits"),
    "b": (BUDGET_EXCEEDED, "budget_month"),
}


def _reserve_short(short: tuple[LeaseNeed, ...], key_id: str, reset: int) -> LeaseShort:
    refusals = []
    for need in short:
        if need.kind == "t":
            refusal = ReserveRefusal.build(
                code=RATE_LIMITED, scope="key", limit="tpm", retry_after=reset
            )
        else:
            code, limit = _RESERVE_SHORT[need.kind]
            scope: Scope = "org" if need.kind in "cb" else "key"
            if need.kind in "dm" and need.subject != key_id:
                scope = "parent"
            refusal = ReserveRefusal.build(code=code, scope=scope, limit=limit)
        refusals.append(refusal)
    return LeaseShort(short, tuple(refusals))


def _clamp(amount: int, reserved: int, res: Reservation, what: str) -> int:
    if amount > reserved:
        logger.warning(
            "reservation %d: %s %d exceeds reserved %d; clamped",
            res.id,
            what,
            amount,
            reserved,
        )
        return reserved
    if amount < 0:
        logger.warning("reservation %d: negative %s %d; voided", res.id, what, amount)
        return 0
    return amount


def _window(posted: int, pending: int, limit: int | None, resets: int) -> SpendWindow:
    remaining = None if limit is None else max(0, limit - posted - pending)
    return SpendWindow.build(
        spent=posted, reserved=pending, limit=limit, remaining=remaining, resets_at=resets
    )
