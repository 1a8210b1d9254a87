"""The shard pool: router, supervisor, and the API request handlers call.

Routing: a key *family* (a root key, its rotations and its sub-keys) maps to one
shard by ``crc32(family_id) % n_shards`` (:func:`shard_index`), stable across
processes and restarts, unlike Python's salted ``hash``. So a parent and its
sub-keys always meet in one actor, and their caps are checked in one step. A key is
routed once, when the caller resolves it to a :class:`~shards.keys.KeyRef`
(:meth:`ShardPool.key_ref`); every message then carries the ref's shard index and
state.

The request walk through the pool::

    handler                        pool                     shard actor (one task)
    3  await pool.admit(...)  ──► route by family ──► rpm window, org/platform
                                                       window, in-flight slot
    8  await pool.reserve(...) ─► route by family ──► tpm window; key + parent caps;
                                                       OrgBook credits + budget;
                                                       all-or-nothing pending
    10 await pool.settle(...)  ─► route (shielded) ─► release slot; resolve the
                                                       reservation exactly once

Every call is bounded by ``reply_timeout_s`` (enforced by a watchdog task, so a
wait may last up to 1.25 × that); past it the caller gets
:class:`~shards.actor.ShardUnavailable` (503 admission_unavailable) and the message
is marked abandoned, so a late actor never applies it: nothing is ever admitted
unchecked, and nothing is left behind for a caller that gave up.

Organisation accounts live in one :class:`~shards.org.OrgBook` shared by all shards
and changed only by synchronous code in the trio thread (see :mod:`shards.org`),
which is what makes the cross-family check-and-reserve atomic. The synchronous
methods below (``set_org``, ``add_org_credits``, ``load_spend``...) rely on the same
rule: call them from the trio thread (or before it starts), never from another one.

Supervision: :meth:`ShardPool.run` starts the watchdog and every actor in its own
nursery. An error while handling one message is answered to that caller and
logged; the actor goes on. An error that kills an actor's loop propagates and takes
the pool (and the app nursery above it) down, loudly.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypedDict, Unpack

import trio

from .actor import Shard, ShardUnavailable, Watchdog
from .clock import Clock, NonDecreasingClock, SystemClock
from .keys import KeyRef
from .leases import LeaseBook, LeaseShort
from .messages import (
    Admission,
    AdmitRequest,
    KeyStatus,
    KeyStatusRequest,
    Reservation,
    ReserveRefusal,
    ReserveRequest,
    SettleRequest,
)
from .org import OrgBook, OrgSnapshot
from .state import ShardState
from .windows import MINUTE_S, day_window, month_of_day

__all__ = ["PoolStatistics", "ShardPool", "ShardUnavailable", "StatusLimits", "shard_index"]


class StatusLimits(TypedDict):
    """The caps a key's windows are read against (:class:`KeyStatusRequest` besides the key),
    given by keyword to :meth:`ShardPool.key_status`."""

    rpm: int
    tpm: int | None
    max_in_flight: int
    usd_day: int | None
    usd_month: int | None


def shard_index(family_id: str, n_shards: int) -> int:
    """The shard of a key family: stable across processes (crc32, not ``hash``)."""
    return zlib.crc32(family_id.encode()) % n_shards


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolStatistics:
    """A snapshot of the pool, in the style of trio's ``statistics()`` methods."""

    n_shards: int
    running: bool
    keys_per_shard: tuple[int, ...]
    queue_lengths: tuple[int, ...]
    pending_reservations: tuple[int, ...]
    orgs: int
    #: messages applied / failed in a handler / skipped as abandoned, all shards
    handled: int
    failed: int
    abandoned: int
    #: callers woken by the watchdog without an answer (ShardUnavailable)
    timed_out: int


class ShardPool:
    """``n_shards`` actors owning all per-key admission state (see module docstring)."""

    def __init__(
        self,
        n_shards: int = 16,
        clock: Clock | None = None,
        queue_size: int = 1024,
        reply_timeout_s: float = 2.0,
        platform_rpm: int | None = None,
    ) -> None:
        if n_shards < 1:
            raise ValueError("n_shards must be at least 1")
        if queue_size < 1:
            raise ValueError("queue_size must be at least 1 (mailboxes are bounded)")
        if reply_timeout_s <= 0:
            raise ValueError("reply_timeout_s must be positive")
        self._clock = NonDecreasingClock(clock if clock is not None else SystemClock())
        self._orgs = OrgBook(platform_rpm)
        ids = itertools.count(1)
        self._watchdog = Watchdog(reply_timeout_s)
        self._shards = tuple(
            Shard(i, ShardState(self._clock, self._orgs, ids, i), queue_size, self._watchdog)
            for i in range(n_shards)
        )
        self._n = n_shards
        self._running = False
        #: the node's leases when several nodes share the limits (:meth:`use_leases`)
        self.leases: LeaseBook | None = None

    def use_leases(self) -> LeaseBook:
        """Admit every request that names its key (``key_id``) against leases from now
        on (several nodes on one database); returns the pool's book."""
        self.leases = LeaseBook()
        for shard in self._shards:
            shard.state.leases = self.leases
        return self.leases

    @property
    def n_shards(self) -> int:
        return self._n

    @property
    def clock(self) -> Clock:
        """The wall clock as the pool sees it (never goes backwards)."""
        return self._clock

    # -- lifecycle ----------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run every shard actor; ``started()`` once all are up; run until cancelled.

        Start it with ``await nursery.start(pool.run)``. It may be run again after
        it stopped (state and queued messages are kept), never twice at once.
        """
        if self._running:
            raise RuntimeError("this ShardPool is already running")
        self._running = True
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self._watchdog.run)
                for shard in self._shards:
                    await nursery.start(shard.run)
                task_status.started()
        finally:
            self._running = False

    # -- routing --------------------------------------------------------------------

    def shard_index(self, family_id: str) -> int:
        return shard_index(family_id, self._n)

    def _shard(self, family_id: str) -> Shard:
        return self._shards[shard_index(family_id, self._n)]

    def key_ref(self, key_id: str, family_id: str) -> KeyRef:
        """Resolve a key once: the ref every message about it carries (see
        :class:`~shards.keys.KeyRef`). The same ref for the same key id, always.

        Key ids are unique across families (the gateway's are): a shard refuses an id
        it already holds under another family (``ValueError``).
        Synchronous: call it from the trio thread (or before the pool runs).
        """
        return self._shard(family_id).state.key_ref(key_id, family_id)

    # -- the request walk -----------------------------------------------------------

    # ``admit``, ``reserve`` and ``settle`` hand back the shard's own coroutine instead
    # of awaiting it in one of their own: one coroutine and frame fewer per step. They
    # route by the shard index the caller's ref gave it.

    def admit(self, req: AdmitRequest) -> Awaitable[Admission | LeaseShort]:
        """Step 3 (await it): count the request, check rpm (key, org, platform),
        take a slot."""
        return self._shards[req.shard].call(req)

    def reserve(self, req: ReserveRequest) -> Awaitable[Reservation | ReserveRefusal | LeaseShort]:
        """Step 8 (await it): count tpm, then reserve key + parent + org
        all-or-nothing."""
        return self._shards[req.shard].call(req)

    def settle(self, req: SettleRequest) -> Awaitable[None]:
        """Step 10 (await it): release the slot, resolve the reservation once
        (must-deliver).

        Delivered even if the calling task is being cancelled. Raises
        :class:`ShardUnavailable` only if the shard failed or did not confirm in
        time; a late settlement is still applied when the actor reaches it.
        """
        return self._shards[req.shard].call_must_deliver(req)

    def key_status(self, key: KeyRef, **limits: Unpack[StatusLimits]) -> Awaitable[KeyStatus]:
        """Windows of one key for GET /v1/key (await it); counts nothing, takes no slot."""
        request = KeyStatusRequest.build(shard=key.shard, key=key.state, **limits)
        return self._shards[key.shard].call(request)

    def key_status_nowait(self, key: KeyRef, **limits: Unpack[StatusLimits]) -> KeyStatus:
        """Synchronous :meth:`key_status`, bypassing the mailbox: a read of the shard's
        state, which only the trio thread touches."""
        request = KeyStatusRequest.build(shard=key.shard, key=key.state, **limits)
        return self._shards[key.shard].state.status(request)

    # -- start-up rebuild and operator changes (synchronous) ------------------------

    def load_spend(
        self, key_id: str, family_id: str, day_spent_nanos: int, month_spent_nanos: int
    ) -> None:
        """Set the settled spend of today and this month (UTC) of one key.

        A parent's figures must include its sub-keys' spend: a parent's windows
        hold the whole family's spend, as the caps count it.
        """
        self._shard(family_id).state.load_spend(
            key_id, family_id, day_spent_nanos, month_spent_nanos
        )

    def set_org(
        self,
        org_id: str,
        credits_nanos: int,
        budget_month_nanos: int | None,
        billed_month_nanos: int = 0,
    ) -> None:
        """Load an org: credit balance, monthly budget, amount billed this month."""
        month = month_of_day(day_window(self._clock.now()))
        self._orgs.set_org(org_id, credits_nanos, budget_month_nanos, billed_month_nanos, month)

    def set_org_budget(self, org_id: str, budget_month_nanos: int | None) -> None:
        """Change an org's monthly budget (None removes it); pending stays."""
        self._orgs.set_budget(org_id, budget_month_nanos)

    def add_org_credits(self, org_id: str, delta_nanos: int) -> int:
        """Top up (or take back) credits; returns the new balance in nano-USD."""
        return self._orgs.add_credits(org_id, delta_nanos)

    def org_snapshot(self, org_id: str) -> OrgSnapshot:
        """Balance, reserved, used, budget and this minute's requests of an org."""
        t = self._clock.now()
        return self._orgs.snapshot(org_id, month_of_day(day_window(t)), int(t // MINUTE_S))

    # -- introspection ----------------------------------------------------------------

    def statistics(self) -> PoolStatistics:
        shards = self._shards
        return PoolStatistics(
            n_shards=self._n,
            running=self._watchdog.running and all(s.running for s in shards),
            keys_per_shard=tuple(len(s.state.keys) for s in shards),
            queue_lengths=tuple(s.queue_length() for s in shards),
            pending_reservations=tuple(len(s.state.pending) for s in shards),
            orgs=len(self._orgs),
            handled=sum(s.handled for s in shards),
            failed=sum(s.failed for s in shards),
            abandoned=sum(s.skipped for s in shards),
            timed_out=self._watchdog.expired,
        )
