"""Organisation accounts: credits, monthly budget, org rate window, platform window.

Key state is partitioned by family across shards, but an organisation spans
families, so its accounts cannot live in one shard. They live in one
:class:`OrgBook` owned by the pool and shared by every shard.

Invariant (what makes check-and-reserve atomic without locks)
-------------------------------------------------------------
The OrgBook is mutated ONLY by synchronous code running in the trio thread: the
shard actors' message handlers (which never ``await`` between a check and the
update it guards) and the pool's synchronous operator methods (``set_org``,
``add_org_credits``...). trio runs one task at a time and switches only at an
``await``, so every "check credits and budget, then add pending" step runs to
completion before any other reservation can look at the same numbers. No
interleaving of concurrent calls can therefore push ``debited + pending`` past the
credit balance or ``month_billed + month_pending`` past the budget. Never touch an
OrgBook from another thread, and never put an ``await`` inside a handler.

Accounts, in the shape of two-phase transfers
---------------------------------------------
- credits: ``credits`` (balance at load time plus top-ups), ``debited`` (billed
  since load) and ``pending`` (reserved, unresolved). Available =
  ``credits - debited - pending``. Not windowed.
- budget: ``month_billed`` and ``month_pending`` of the current UTC month, checked
  against ``budget`` (None = no budget). Rolls over on the 1st; a reservation made
  in an older month neither releases into nor posts to the new one.
- rate: ``requests`` in clock minute ``minute`` (org-wide rpm), and the same pair
  for the whole platform on the book itself.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OrgBook", "OrgSnapshot", "OrgState"]


class OrgState:
    """Mutable accounts of one organisation (see the module docstring)."""

    __slots__ = (
        "budget",
        "credits",
        "debited",
        "minute",
        "month",
        "month_billed",
        "month_pending",
        "pending",
        "requests",
    )

    def __init__(self, credits: int = 0, budget: int | None = None) -> None:
        self.credits = credits
        self.debited = 0
        self.pending = 0
        self.budget = budget
        self.month = -1
        self.month_billed = 0
        self.month_pending = 0
        self.minute = -1
        self.requests = 0

    def roll_month(self, month: int) -> None:
        """Start a new budget window if ``month`` is later than the current one."""
        if month > self.month:
            self.month = month
            self.month_billed = 0
            self.month_pending = 0

    def count_request(self, minute: int) -> int:
        """Count one request in clock minute ``minute``; return the count so far."""
        if minute > self.minute:
            self.minute = minute
            self.requests = 0
        self.requests += 1
        return self.requests


@dataclass(frozen=True, slots=True, kw_only=True)
class OrgSnapshot:
    """A consistent read of one organisation's accounts, in nano-USD."""

    org_id: str
    #: credits left after posted debits (reservations not deducted)
    balance: int
    #: pending against credits
    reserved: int
    #: balance - reserved
    available: int
    #: debited since the state was loaded
    used: int
    budget_month: int | None
    month_billed: int
    month_reserved: int
    #: None when there is no budget; never negative
    budget_remaining: int | None
    requests_this_minute: int


class OrgBook:
    """Every organisation's accounts plus the platform-wide request window."""

    __slots__ = ("_orgs", "platform_minute", "platform_requests", "platform_rpm")

    def __init__(self, platform_rpm: int | None = None) -> None:
        self._orgs: dict[str, OrgState] = {}
        self.platform_rpm = platform_rpm
        self.platform_minute = -1
        self.platform_requests = 0

    def __len__(self) -> int:
        return len(self._orgs)

    def get(self, org_id: str) -> OrgState:
        """The org's state, created empty (no credits, no budget) on first use."""
        org = self._orgs.get(org_id)
        if org is None:
            org = self._orgs[org_id] = OrgState()
        return org

    def count_platform_request(self, minute: int) -> int:
        if minute > self.platform_minute:
            self.platform_minute = minute
            self.platform_requests = 0
        self.platform_requests += 1
        return self.platform_requests

    # -- operator side (synchronous, atomic under trio) -------------------------

    def set_org(
        self,
        org_id: str,
        credits: int,
        budget_month: int | None,
        billed_month: int,
        month: int,
    ) -> None:
        """Load an org: balance ``credits``, budget, spend billed so far in ``month``.

        Pending reservations survive (a reload must not free reserved money);
        ``used`` restarts from 0 because ``credits`` is the balance after it.
        """
        org = self.get(org_id)
        org.credits = credits
        org.debited = 0
        org.budget = budget_month
        org.roll_month(month)
        org.month_billed = billed_month

    def set_budget(self, org_id: str, budget_month: int | None) -> None:
        self.get(org_id).budget = budget_month

    def add_credits(self, org_id: str, delta: int) -> int:
        """Add (or with a negative delta, remove) credits; return the new balance."""
        org = self.get(org_id)
        org.credits += delta
        return org.credits - org.debited

    def snapshot(self, org_id: str, month: int, minute: int) -> OrgSnapshot:
        org = self._orgs.get(org_id) or OrgState()
        month_billed = org.month_billed if org.month == month else 0
        month_pending = org.month_pending if org.month == month else 0
        balance = org.credits - org.debited
        remaining = None
        if org.budget is not None:
            remaining = max(0, org.budget - month_billed - month_pending)
        return OrgSnapshot(
            org_id=org_id,
            balance=balance,
            reserved=org.pending,
            available=balance - org.pending,
            used=org.debited,
            budget_month=org.budget,
            month_billed=month_billed,
            month_reserved=month_pending,
            budget_remaining=remaining,
            requests_this_minute=org.requests if org.minute == minute else 0,
        )
