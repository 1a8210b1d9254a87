"""One node of several on one PostgreSQL database (DESIGN "Past one machine").

A :class:`Node` registers the process under ``[cluster] node_id`` and then, in the root
nursery:

- renews its registration every ``lease_s / 4``; a node that has not renewed for
  ``lease_s * 3 / 4`` (the database lost, the process stalled) is *fenced*: it admits
  nothing (503 admission_unavailable, ``/readyz`` 503) until a renewal succeeds, a
  quarter of ``lease_s`` before the database may take its leases for expired. A
  registration found gone (a live node swept it) ends the process: its leases and
  pending rows have been taken over, and a supervisor restarts it afresh;
- sweeps every ``lease_s / 4``: nodes whose registration expired lose their leases and
  their pending rows are settled by recovery (:func:`gateway.store.node_leases.sweep`). Not
  in the first ``lease_s / 2`` after this node could not reach the database: every node
  lost it too, maybe, and each gets the time to renew (an expired registration that was
  not swept is renewed, its leases intact) before it is taken for dead;
- gives back, every ``lease_s / 4``, the unused leases not used for ``lease_s / 2``;
- polls the change counter every :data:`POLL_S` and reloads keys, organisations and
  provider credentials when it moved: a change made on any node (revocation, disable,
  rotation, caps, policy, credits added, a model switched off or on) is seen by every
  node within
  ``POLL_S`` plus a reload. A new key need not wait for it: a node that meets a token of
  a key it does not hold looks it up by its prefix first (:mod:`gateway.accounts.key_lookup`).

Refills (:meth:`Node.refill`) run when a shard answers :class:`shards.LeaseShort`: one
short transaction per limit, one at a time per limit on this node.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, Protocol, TypeVar

import trio

from gateway.accounts.catalog import Catalog, nanos_to_usd
from gateway.accounts.key_lookup import KeyLookup
from gateway.accounts.keyring import Keyring
from gateway.accounts.orgs import Org
from gateway.config.settings import Config
from gateway.observe.logs import event
from gateway.store import Store, StoreError, records
from gateway.store import node_leases as ops
from shards import LeaseNeed, LeaseShort, ShardPool
from shards.clock import Clock

log = logging.getLogger("gateway.serving.node")
T = TypeVar("T")
#: how often the change counter is polled (the bound of a change reaching every node is
#: this plus one reload)
POLL_S = 1.0
#: how long a start waits for a registration of its node id to expire, past lease_s
REGISTER_MARGIN_S = 1.0


class Host(Protocol):
    """What a node uses of its server (:class:`gateway.serving.runtime.Runtime`, which
    builds the node: a protocol, not an import, keeps the two out of a circle)."""

    @property
    def config(self) -> Config: ...
    @property
    def store(self) -> Store: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def pool(self) -> ShardPool: ...
    @property
    def keyring(self) -> Keyring: ...
    @property
    def catalog(self) -> Catalog: ...
    @property
    def orgs(self) -> dict[str, Org]: ...
    @property
    def byok(self) -> dict[tuple[str, str], str]: ...
    def month(self) -> str: ...
    def load_orgs(
        self,
        rows: list[dict[str, Any]],
        balances: dict[str, dict[str, int]],
        billed: dict[str, int],
    ) -> None: ...


class NodeLost(Exception):
    """The node's registration is gone: another node took over its leases."""


class Node:
    """This process as one node: registration, fencing, leases and change polling."""

    def __init__(self, runtime: Host) -> None:
        self.rt = runtime
        self.node_id = runtime.config.cluster.node_id
        self.lease_s = runtime.config.cluster.lease_s
        self.book = runtime.pool.use_leases()
        self.epoch = 0
        #: time.monotonic() until which the node may admit (fencing)
        self._admit_until = 0.0
        self._refilling: defaultdict[str, trio.Lock] = defaultdict(trio.Lock)
        #: per limit id, the amounts the calls inside :meth:`refill` lack in all
        self._wanted: defaultdict[str, int] = defaultdict(int)
        self._version = 0
        self._catching_up = trio.Lock()
        #: keys made on other nodes, met before the poll brought them
        self.keys = KeyLookup(runtime.store, runtime.keyring, self.know_org)
        #: time.monotonic() of the first renewal after the database was last unreachable
        self._reachable_since = time.monotonic()

    # -- start-up (synchronous, before the store writer runs) ---------------------------

    def register(self, *, take_over: bool = False) -> None:
        """Register the node id, waiting out a registration of it that has not expired
        (a restart of the same node); StoreError when it is held by a live node.

        ``take_over``: the previous holder of the id is known to be gone (a worker the
        supervisor saw end): its registration is swept at once instead."""
        if take_over:
            found = self.rt.store.call(ops.take_over, self.node_id)
            if found["calls"]:
                log.warning(
                    "node %s: %d interrupted calls of its predecessor settled, %s USD counted",
                    self.node_id,
                    found["calls"],
                    nanos_to_usd(found["nanos"]),
                    extra=event("recovery", calls=found["calls"]),
                )
        deadline = time.monotonic() + self.lease_s + REGISTER_MARGIN_S
        while True:
            sent = time.monotonic()
            registration = self.rt.store.call(ops.register, self.node_id, self.lease_s)
            if registration.epoch:
                break
            if time.monotonic() + registration.held_s > deadline:
                raise StoreError(
                    f"node id {self.node_id!r} is held by a live node on {self.rt.store.name}"
                    " ([cluster] node_id must differ between nodes)"
                )
            time.sleep(min(registration.held_s, 1.0))
        self.epoch = registration.epoch
        self._admit_until = self._fence_at(sent)
        log.info("node %s registered (lease %.1f s)", self.node_id, self.lease_s)

    def recover(self) -> None:
        """Start-up: settle what dead nodes left (their registrations expired) and the
        rows no registered node covers; take the current changes."""
        swept = self.rt.store.call(ops.sweep, self.rt.clock.now())
        orphans = self.rt.store.call(ops.recover_orphans)
        calls = swept["calls"] + orphans["calls"]
        if calls:
            log.warning(
                "recovery: %d interrupted calls of gone nodes settled, %s USD counted",
                calls,
                nanos_to_usd(swept["nanos"] + orphans["nanos"]),
                extra=event("recovery", calls=calls),
            )
        self._version = self.rt.store.call(ops.version)
        self.switch_models(self.rt.store.call(ops.model_switches))

    def renew_now(self) -> None:
        """Renew at once (start-up, before the store writer runs)."""
        sent = time.monotonic()
        if not self.rt.store.call(ops.renew, self.node_id, self.epoch, self.lease_s):
            raise StoreError(f"node {self.node_id}: its registration expired during start-up")
        self._admit_until = self._fence_at(sent)

    def _fence_at(self, sent: float) -> float:
        """Admit until 3/4 of a lease after a renewal that was sent at monotonic ``sent``
        (the database's expiry counts from its own later receipt)."""
        return sent + self.lease_s * 0.75

    # -- admission ----------------------------------------------------------------------

    def admitting(self) -> bool:
        return time.monotonic() < self._admit_until

    async def refill(self, short: LeaseShort, again: Callable[[], Awaitable[T]]) -> T | Any:
        """Refill every limit ``short`` names, then ``again()`` (ask the shard again)
        while still holding them: the refusal of the first limit the database cannot
        cover, or what ``again`` answers. StoreError: the database is gone.

        The limits stay held until the shard has answered, so the calls queued on one
        refill take its grant one at a time: asked outside, every queued call found the
        grant "covered" at once, all asked, one won, and the rest spent a refill each
        round until one ran out of them (a 503 with headroom left)."""
        async with AsyncExitStack() as held:
            unique = {need.limit_id: need for need in short.needs}
            for _, need in sorted(unique.items()):
                await held.enter_async_context(self._holding(need))
            for need, refusal in zip(short.needs, short.refusals, strict=True):
                if not await self._refill_one(need):
                    return refusal
            return await again()

    @asynccontextmanager
    async def _holding(self, need: LeaseNeed) -> AsyncIterator[None]:
        """The limit's refill lock (locks are taken in limit-id order: no deadlock),
        ``need`` counted in what the node's calls waiting on it want."""
        lid = need.limit_id
        lock = self._refilling[lid]
        self._wanted[lid] += need.amount
        try:
            async with lock:
                yield
        finally:
            self._wanted[lid] -= need.amount
            if not lock.locked() and not lock.statistics().tasks_waiting:
                self._refilling.pop(lid, None)  # one lock per limit in use
                self._wanted.pop(lid, None)

    async def _refill_one(self, need: LeaseNeed) -> bool:
        deficit = self.book.deficit(need)
        if not deficit:
            return True  # a refill for another call covered it meanwhile
        # the calls queued behind this one on the same limit: one refill for them (up to
        # a node's share, lease_size)
        wanted = self.book.deficit(need._replace(amount=self._wanted[need.limit_id]))
        try:
            grant = await self.rt.store.transact(
                ops.refill, self.node_id, self.epoch, need._replace(amount=deficit), wanted
            )
        except ops.Fenced:
            self._admit_until = 0.0
            raise StoreError("this node's leases expired") from None
        if grant < deficit:
            return False
        self.book.grant(need.limit_id, grant, self.rt.clock.now())
        return True

    # -- background ---------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._renew)
            nursery.start_soon(self._chores)
            nursery.start_soon(self._poll)
            task_status.started()

    async def _renew(self) -> None:
        while True:
            await trio.sleep(self.lease_s / 4)
            sent = time.monotonic()
            try:
                renewed = await self.rt.store.transact(
                    ops.renew, self.node_id, self.epoch, self.lease_s
                )
            except StoreError:
                log.warning("node %s: cannot renew its leases (database unreachable)", self.node_id)
                self._reachable_since = float("inf")
                continue
            if not renewed:
                self._admit_until = 0.0
                raise NodeLost(
                    f"node {self.node_id}: its registration expired and was taken over;"
                    " stopping (a supervisor restarts it as a fresh node)"
                )
            self._admit_until = self._fence_at(sent)
            self._reachable_since = min(self._reachable_since, sent)

    async def _chores(self) -> None:
        while True:
            await trio.sleep(self.lease_s / 4)
            try:
                await self.give_back(self.rt.clock.now() - self.lease_s / 2)
                if time.monotonic() - self._reachable_since < self.lease_s / 2:
                    continue  # after an outage every node first gets its chance to renew
                swept = await self.rt.store.transact(ops.sweep, self.rt.clock.now())
            except StoreError:
                continue
            if swept["nodes"]:
                log.warning(
                    "swept %d expired nodes: %d interrupted calls settled",
                    swept["nodes"],
                    swept["calls"],
                    extra=event("recovery", calls=swept["calls"], nodes=swept["nodes"]),
                )

    async def give_back(self, before: float) -> None:
        """Unused leases not used since ``before`` go back to the database (dropped from
        the book first: nothing may admit against them meanwhile)."""
        returned = [(lid, self.book.reclaim(lid)) for lid in self.book.idle(before)]
        returned = [(lid, amount) for lid, amount in returned if amount > 0]
        if not returned:
            return
        try:
            await self.rt.store.transact(ops.give_back, self.node_id, returned)
        except StoreError:
            for lid, amount in returned:  # still the node's: not stranded, used again
                self.book.give(lid, amount)
            raise

    async def leave(self) -> None:
        """A node stopping: every unused lease back, its registration expired now."""
        with trio.move_on_after(2):
            try:
                await self.give_back(float("inf"))
                await self.rt.store.transact(ops.leave, self.node_id, self.epoch)
            except StoreError:
                log.warning("node %s: could not leave; its lease expires", self.node_id)

    async def _poll(self) -> None:
        while True:
            await trio.sleep(POLL_S)
            try:
                await self.catch_up()
            except StoreError:
                continue

    async def catch_up(self) -> None:
        """The change poll's step, now: reload if the change counter moved since the
        last one. Also run by an admin call that missed an organisation or a key by id
        (:mod:`gateway.edge.routes.admin`): made through another node or worker a moment
        ago, it is answered, not a 404 until the next poll. StoreError if the database
        is away.

        One at a time (the poll's and the admin calls'): a miss that came while a reload
        ran waits for that reload, whose version it would read as current. The version
        is read before the rows (they are at least that new) and taken as seen once they
        are loaded (a reload cut short by the database is run again)."""
        async with self._catching_up:
            version = await self.rt.store.read(ops.version)
            if version != self._version:
                await self.reload()
                self._version = version

    async def reload(self) -> None:
        """What other nodes changed: keys, organisations (policy, budget), credits
        added, provider credentials, model switches."""
        store, rt = self.rt.store, self.rt
        rt.keyring.load(await store.read(records.all_keys))
        await self._reload_orgs()
        for row in await store.read(records.list_provider_credentials):
            rt.byok[(row["org_id"], row["provider"])] = row["api_key_env"]
        self.switch_models(await store.read(ops.model_switches))

    async def _reload_orgs(self) -> None:
        store, rt = self.rt.store, self.rt
        rt.load_orgs(
            await store.read(records.list_orgs),
            await store.read(records.org_balances),
            await store.read(records.org_billed, rt.month()),
        )

    async def know_org(self, org_id: str) -> None:
        """Bring the organisations up to date before a key looked up is learned: the
        key may be of an organisation made on another node, or changed there since
        this node's last poll (credits added, a policy): reloaded when ``org_id`` is
        not known or the change counter moved."""
        version = await self.rt.store.read(ops.version)
        if org_id not in self.rt.orgs or version != self._version:
            await self._reload_orgs()

    def switch_models(self, switches: dict[str, bool]) -> None:
        """The operator's model switches, as every node applies them."""
        for model_id, enabled in switches.items():
            self.rt.catalog.set_enabled(model_id, enabled)

    async def switch_model(self, model_id: str, enabled: bool) -> None:
        """Store a model's switch for every node (this one applies it itself)."""
        await self.rt.store.write(ops.switch_model, model_id, enabled, self.rt.clock.now())
