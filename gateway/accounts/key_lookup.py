"""A key this node does not hold yet, looked up in the store (several nodes).

With several nodes on one database, a key made through one node reaches the others by
the change poll (:mod:`gateway.serving.node`), up to ``POLL_S`` plus a reload later; a client
that creates a key and calls at once through a balancer would meet a 401 meanwhile. So a
well-formed token whose prefix the keyring does not hold is looked up by that prefix
before the 401 (:func:`gateway.store.records.keys_by_prefixes`), and the key found is
learned as the poll would load it (:meth:`Keyring.learn`). A key works on every node as
soon as its creation has answered, however many are created and used at once.

Lookups are coalesced: one read runs at a time, for every prefix waiting (one indexed
query for them all, up to :data:`BATCH`); the prefixes that arrive meanwhile wait for
the next read, made by the first request of them; concurrent misses of one prefix
share one. So a burst of new keys costs a few reads,
never a refusal.

Unknown tokens must not become database reads at will, so the bounds are keyed to what
floods, never a budget shared by everyone (a stranger could spend it and lock out the
new keys of every other client, issue 50):

- a prefix found in no key is not looked up again for :data:`MISS_TTL_S`;
- each client address starts at most :data:`LOOKUPS_PER_ADDRESS` lookups in a burst,
  refilled at that many a second; past it, its misses are the 401 at once, without a
  read (as before lookups: until the poll). Another address is not concerned.

Only on a cluster: on SQLite one server owns the database and holds every key, so a
miss there is a 401 with no read at all.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import trio

from gateway.accounts import key_record as k
from gateway.accounts.key_record import KeyRecord
from gateway.accounts.keyring import Keyring
from gateway.store import Store, StoreError, records

#: how long a prefix found in no key is a miss without a read. Longer would hide no key
#: a client can hold: a prefix is random and reaches a client only in the answer that
#: created its key (a key made after its prefix was missed would have to have been
#: guessed first)
MISS_TTL_S = 1.0
#: lookups one client address may start in a burst, and per second after it: a client
#: that creates keys in bulk and uses them at once stays under it; what one address
#: costs the database at most (one indexed read each, coalesced)
LOOKUPS_PER_ADDRESS = 50
#: prefixes in one read at most (the query's parameters); more wait for the next read
BATCH = 500
#: addresses remembered before the full (refilled) ones are forgotten
ADDRESSES = 10_000


class _Batch:
    """Prefixes read together, and the event set when their read has ended."""

    def __init__(self) -> None:
        self.prefixes: list[str] = []
        self.done = trio.Event()


class KeyLookup:
    def __init__(
        self,
        store: Store,
        keyring: Keyring,
        know_org: Callable[[str], Awaitable[None]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.keyring = keyring
        #: makes sure the organisation of a key found is known before the key is learned
        #: (a key's policy, budget and rpm are its organisation's)
        self.know_org = know_org
        self.clock = clock
        #: prefix → when its miss expires; insertion order is expiry order (one TTL)
        self._misses: dict[str, float] = {}
        #: prefix → the batch that reads it (waiting or running)
        self._batch_of: dict[str, _Batch] = {}
        #: the batch new prefixes join: waiting for the read in progress to end
        self._next: _Batch | None = None
        self._reading = trio.Lock()
        #: address → (lookups left, when counted)
        self._budgets: dict[str, tuple[float, float]] = {}

    async def find(self, token: str, address: str = "") -> KeyRecord | None:
        """The valid key of ``token`` after a lookup of its prefix, or None (the 401);
        ``address`` is the client's (whose budget a new lookup spends)."""
        parsed = k.parse_token(token)
        if parsed is None or self.keyring.holds(parsed[1]):
            return None  # malformed, or a held key that refused the token: no read
        prefix = parsed[1]
        batch = self._batch_of.get(prefix)
        if batch is not None:
            await batch.done.wait()
        else:
            now = self.clock()
            self._forget_misses(now)
            if prefix in self._misses or not self._spend(address, now):
                return None
            await self._join(prefix)
        return self.keyring.authenticate(token)

    def _spend(self, address: str, now: float) -> bool:
        """One lookup out of ``address``'s budget, if any is left."""
        budgets = self._budgets
        left, then = budgets.get(address, (LOOKUPS_PER_ADDRESS, now))
        left = min(LOOKUPS_PER_ADDRESS, left + (now - then) * LOOKUPS_PER_ADDRESS)
        if left < 1:
            return False
        if address not in budgets and len(budgets) >= ADDRESSES:
            self._forget_full(now)
        budgets[address] = (left - 1, now)
        return True

    def _forget_full(self, now: float) -> None:
        """Drop the addresses whose budget has refilled (as a new one's)."""
        full = [a for a, (left, then) in self._budgets.items() if now - then >= 1.0]
        for address in full:
            del self._budgets[address]

    def _forget_misses(self, now: float) -> None:
        misses = self._misses
        while misses:
            oldest = next(iter(misses))
            if misses[oldest] > now:
                return
            del misses[oldest]

    async def _join(self, prefix: str) -> None:
        """``prefix`` into the batch that waits for the read in progress, or into a
        new one which this request reads (then every request of it has its answer)."""
        batch = self._next
        if batch is not None and len(batch.prefixes) < BATCH:
            batch.prefixes.append(prefix)
            self._batch_of[prefix] = batch
            await batch.done.wait()
            return
        batch = self._next = self._batch_of[prefix] = _Batch()
        batch.prefixes.append(prefix)
        try:
            async with self._reading:  # one read at a time, batches in their order
                if self._next is batch:
                    self._next = None  # read now: the prefixes after it wait for the next
                await self._read(batch.prefixes)
        finally:
            if self._next is batch:
                self._next = None
            for each in batch.prefixes:
                del self._batch_of[each]
            batch.done.set()

    async def _read(self, prefixes: list[str]) -> None:
        try:
            found = await self.store.read(records.keys_by_prefixes, prefixes)
            for org_id in {rows[0]["org_id"] for rows in found.values()}:
                await self.know_org(org_id)
        except StoreError:
            return  # the database is away: the 401 of a key this node does not hold
        for rows in found.values():
            self.keyring.learn(rows)
        expiry = self.clock() + MISS_TTL_S
        for prefix in prefixes:
            if prefix not in found:
                self._misses[prefix] = expiry
