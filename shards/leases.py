"""Leased headroom: what a node may admit of a limit that several nodes share.

With several nodes on one database (a PostgreSQL store), a limit that spans calls (a
key's rpm, a spend cap, an org's credits...) is split into *leases*: slices of its
headroom granted to one node in one database transaction, such that the sum of the
leases (plus what is already spent) never exceeds the limit. A shard admits against
its pool's :class:`LeaseBook`, synchronously and in memory, as it admits against its
own counters; a node without enough lease for a call gets a :class:`LeaseShort`
verdict instead, refills the leases it names (``gateway/serving/node.py``, one short
transaction each) and asks again. A limit whose refill found no headroom left makes
the call's ordinary refusal (carried in the verdict).

A limit is named by a :class:`LeaseNeed`'s ``kind``, ``subject`` and ``window``:

====  ===========================  ===========================================
kind  subject, window              limit
====  ===========================  ===========================================
r     key id, clock minute         the key's rpm
t     key id, clock minute         the key's tpm (worst-case tokens)
s     key id, 0                    the key's in-flight slots (given back at settle)
o     org id, clock minute         the org's rpm
p     "", clock minute             the platform rpm
d     key id, UTC day              the key's usd_day (a parent's: its family's)
m     key id, UTC month            the key's usd_month (likewise)
c     org id, 0                    the org's credits (the ledger's balance)
b     org id, UTC month            the org's monthly budget
====  ===========================  ===========================================

Spend (d, m, c, b) is *consumed*: a settlement posts ``cap_amount`` / ``billed_amount``
out of the node's lease in the same transaction that writes the spend, and gives the
rest of the reservation back to the local balance. Counters (r, t, o, p) are consumed
locally and their leases end with their minute; slots come back at settle.

Only the pool's actors and the trio thread touch a book, one synchronous step at a
time: no locks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from .keys import INT64_MAX
from .windows import DAY_S, MINUTE_S, month_of_day

if TYPE_CHECKING:
    from .messages import Admission, AdmitRequest, ReserveRefusal, ReserveRequest

__all__ = [
    "COUNTER_KINDS",
    "SPEND_KINDS",
    "LeaseBook",
    "LeaseNeed",
    "LeaseShort",
    "admit_needs",
    "lease_size",
    "posted",
    "reserve_needs",
]

#: kinds whose lease is consumed by settled spend (written with the settlement)
SPEND_KINDS = frozenset("dmcb")
#: kinds counted per clock minute and never given back but on idle
COUNTER_KINDS = frozenset("rtop")


class LeaseNeed(NamedTuple):
    """What one step needs of one limit: ``amount`` out of a limit of ``limit``
    (None: the limit is the database's, as an org's credits are)."""

    kind: str
    subject: str
    window: int
    amount: int
    limit: int | None

    @property
    def limit_id(self) -> str:
        return f"{self.kind}:{self.subject}:{self.window}"


class LeaseShort(NamedTuple):
    """The node's leases cannot cover a step: refill ``needs`` (each the whole amount
    the step wants of its limit) and ask again, or answer the refusal paired with the
    first need the database cannot cover."""

    needs: tuple[LeaseNeed, ...]
    refusals: tuple[Admission | ReserveRefusal, ...]


def admit_needs(req: AdmitRequest, minute: int, platform_rpm: int | None) -> list[LeaseNeed]:
    """Step 3's leases: one request of the key's, the org's and the platform's rpm, and
    an in-flight slot for a model call."""
    assert req.key_id is not None
    needs = [LeaseNeed("r", req.key_id, minute, 1, req.rpm)]
    if req.org_rpm is not None:
        needs.append(LeaseNeed("o", req.org_id, minute, 1, req.org_rpm))
    if platform_rpm is not None:
        needs.append(LeaseNeed("p", "", minute, 1, platform_rpm))
    if req.take_slot:
        needs.append(LeaseNeed("s", req.key_id, 0, 1, req.max_in_flight))
    return needs


def reserve_needs(req: ReserveRequest, t: float, budget: int | None) -> list[LeaseNeed]:
    """Step 8's leases: the worst-case tokens of the key's tpm, the cost out of the key's
    and its parent's day and month caps, and the org's cost out of its credits (live
    keys) and budget. Nothing is needed of an amount of zero or an unlimited limit."""
    assert req.key_id is not None
    day = int(t // DAY_S)
    month = month_of_day(day)
    needs = []
    if req.tpm is not None and req.tokens:
        needs.append(LeaseNeed("t", req.key_id, int(t // MINUTE_S), req.tokens, req.tpm))
    if req.cost:
        for subject, usd_day, usd_month in (
            (req.key_id, req.key_usd_day, req.key_usd_month),
            (req.parent_id, req.parent_usd_day, req.parent_usd_month),
        ):
            if subject is None:
                continue
            if usd_day is not None:
                needs.append(LeaseNeed("d", subject, day, req.cost, usd_day))
            if usd_month is not None:
                needs.append(LeaseNeed("m", subject, month, req.cost, usd_month))
    if req.org_cost:
        if req.check_credits:
            needs.append(LeaseNeed("c", req.org_id, 0, req.org_cost, None))
        if budget is not None:
            needs.append(LeaseNeed("b", req.org_id, month, req.org_cost, budget))
    return needs


class LeaseBook:
    """The node's unused leased headroom per limit id, and when each was last used."""

    def __init__(self) -> None:
        #: limit id → unused amount of the node's lease (what it may still admit)
        self.balance: dict[str, int] = {}
        #: limit id → the clock time a step last took from it (for give-back on idle)
        self.used_at: dict[str, float] = {}
        #: False while the node cannot renew its leases (fenced): nothing is admitted
        self.admitting = True

    def short(self, needs: list[LeaseNeed]) -> tuple[LeaseNeed, ...]:
        """The needs the balances cannot cover, each with the whole amount the step
        wants of its limit (a limit named twice wants both amounts; named once here)."""
        balance = self.balance
        wanted: dict[str, int] = {}
        for need in needs:
            lid = need.limit_id
            wanted[lid] = wanted.get(lid, 0) + need.amount
        short, seen = [], set()
        for need in needs:
            lid = need.limit_id
            if lid not in seen and wanted[lid] > balance.get(lid, 0):
                seen.add(lid)
                short.append(need._replace(amount=wanted[lid]))
        return tuple(short)

    def deficit(self, need: LeaseNeed) -> int:
        """What the balance of ``need``'s limit lacks for it now (0: nothing)."""
        return max(0, need.amount - self.balance.get(need.limit_id, 0))

    def take(self, needs: list[LeaseNeed], now: float) -> None:
        """Take every need (after :meth:`short` found none)."""
        balance, used_at = self.balance, self.used_at
        for need in needs:
            lid = need.limit_id
            balance[lid] -= need.amount
            used_at[lid] = now

    def give(self, limit_id: str, amount: int) -> None:
        """Put ``amount`` back into the node's unused lease of ``limit_id``."""
        if amount > 0:
            self.balance[limit_id] = min(self.balance.get(limit_id, 0) + amount, INT64_MAX)

    def grant(self, limit_id: str, amount: int, now: float) -> None:
        """A refill committed in the database: ``amount`` more may be admitted."""
        self.give(limit_id, amount)
        self.used_at[limit_id] = now

    def reclaim(self, limit_id: str) -> int:
        """Drop the node's unused lease of ``limit_id`` (before giving it back to the
        database): returns the amount, which nothing here may admit any more."""
        self.used_at.pop(limit_id, None)
        return self.balance.pop(limit_id, 0)

    def idle(self, before: float) -> list[str]:
        """Limit ids not used since ``before`` (their unused balance may go back)."""
        used_at = self.used_at
        return [lid for lid in self.balance if used_at.get(lid, 0.0) < before]


def lease_size(headroom: int, deficit: int, nodes: int, unit: int, wanted: int = 0) -> int:
    """How much of a limit's ``headroom`` a refill grants a node that lacks ``deficit``
    for a step of ``unit``: nothing when the headroom cannot cover the deficit (the call
    is refused and nothing is stranded), else the deficit, a share of the headroom (one
    ``2 * nodes``-th, in whole units, so that every node may hold one and half of it
    stays in the database) or what the node's calls waiting on this limit want in all
    (``wanted``), whichever is larger. Near a limit the share falls below one unit: a
    node leases what its waiting calls need, so that one refill serves them all (one
    unit per refill would let a burst's calls take each other's grant round after round
    until one runs out of refills: a 503 although the database had the headroom)."""
    if deficit > headroom:
        return 0
    share = headroom // (2 * max(nodes, 1))
    if unit > 0:
        share -= share % unit
    return min(headroom, max(deficit, share, wanted))


def posted(taken: tuple[LeaseNeed, ...], cap: int, billed: int) -> list[tuple[str, int]]:
    """What a settlement posts out of each spend lease its reservation took: ``cap``
    out of the day and month caps, ``billed`` out of credits and budget (each within
    what was reserved, as the shard clamps them)."""
    return [
        (need.limit_id, max(0, min(cap if need.kind in "dm" else billed, need.amount)))
        for need in taken
        if need.kind in SPEND_KINDS
    ]
