"""A key this node does not hold yet, looked up in the store (several nodes).

With several nodes on one database, a key made through one node reaches the others by
the change poll (:mod:`gateway.serving.node`), up to ``POLL_S`` plus a reload later; a client
that creates a key and calls at once through a balancer would meet a 401 meanwhile. So a
well-formed token whose prefix the keyring does not hold is looked up by that prefix
before the 401 (:func:`gateway.store.records.key_by_prefix`), and the key found is
learned as the poll would load it (:meth:`Keyring.learn`). A key works on every node as
soon as its creation has answered.

Unknown tokens must not become database reads at will, so the lookups are bounded:

- a prefix found in no key is not looked up again for :data:`MISS_TTL_S`;
- at most :data:`LOOKUPS_PER_S` lookups start per clock second, and at most
  :data:`LOOKUPS_AT_ONCE` run at once, whatever their prefixes; past either bound a miss
  is the 401 at once, without a read (as it was before lookups: until the poll);
- concurrent misses of one prefix share one lookup.

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

#: how long a prefix found in no key is a miss without a read. One second keeps the
#: misses remembered at once under LOOKUPS_PER_S; longer would hide no key a client can
#: hold: a prefix is random and reaches a client only in the answer that created its key
#: (a key made after its prefix was missed would have to have been guessed first)
MISS_TTL_S = 1.0
#: lookups started per clock second, all prefixes together: what an attacker varying
#: prefixes costs the database at most (one indexed read each), per node
LOOKUPS_PER_S = 50
#: lookups running at once: they share the store's one read connection with every other
#: read, so more would only queue there and delay those
LOOKUPS_AT_ONCE = 4


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
        #: prefix → set when its lookup in progress ends
        self._running: dict[str, trio.Event] = {}
        self._second = 0
        self._started = 0

    async def find(self, token: str) -> KeyRecord | None:
        """The valid key of ``token`` after a lookup of its prefix, or None (the 401)."""
        parsed = k.parse_token(token)
        if parsed is None or self.keyring.holds(parsed[1]):
            return None  # malformed, or a held key that refused the token: no read
        prefix = parsed[1]
        running = self._running.get(prefix)
        if running is not None:
            await running.wait()
        elif self._may_start(prefix):
            await self._look_up(prefix)
        else:
            return None
        return self.keyring.authenticate(token)

    def _may_start(self, prefix: str) -> bool:
        now = self.clock()
        self._forget_misses(now)
        if prefix in self._misses:
            return False
        second = int(now)
        if second != self._second:
            self._second, self._started = second, 0
        if self._started >= LOOKUPS_PER_S or len(self._running) >= LOOKUPS_AT_ONCE:
            return False
        self._started += 1
        return True

    def _forget_misses(self, now: float) -> None:
        misses = self._misses
        while misses:
            oldest = next(iter(misses))
            if misses[oldest] > now:
                return
            del misses[oldest]

    async def _look_up(self, prefix: str) -> None:
        done = self._running[prefix] = trio.Event()
        try:
            rows = await self.store.read(records.key_by_prefix, prefix)
            if rows:
                await self.know_org(rows[0]["org_id"])
                self.keyring.learn(rows)
            else:
                self._misses[prefix] = self.clock() + MISS_TTL_S
        except StoreError:
            pass  # the database is away: the 401 of a key this node does not hold
        finally:
            del self._running[prefix]
            done.set()
