"""The cache's side of a call: its key, the entry or the claim, this process's waiters
on a trio Event, the claim row polled across workers and nodes, and the sweep."""

from __future__ import annotations

import hashlib
import logging
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
import trio

from gateway.accounts.catalog import Model
from gateway.calls.cache.recording import Recording
from gateway.calls.lifecycle import Call
from gateway.calls.settlement import Settlement
from gateway.config.cache import CacheConfig
from gateway.observe.logs import event
from gateway.providers.base import Usage
from gateway.store import Store, StoreError, cache_entries, records
from shards.clock import Clock

log = logging.getLogger("gateway.calls.cache")

HIT, MISS, BYPASS = "hit", "miss", "bypass"
#: body fields that cannot change the answer (or only its form: a stream and its usage chunk)
NOT_KEYED = frozenset({"stream", "stream_options", "tags", "metadata", "user"})
#: how often a call waiting on another process's claim reads it again
POLL_S = 0.05
#: how often expired entries are swept and the oldest past max_entries dropped
SWEEP_S = 60.0


class CacheMetrics(Protocol):
    def cache_result(self, result: str, saved_nanos: int) -> None: ...


def cache_key(
    org_id: str, key_id: str | None, endpoint: str, model: str, ceiling: int, body: dict[str, Any]
) -> str:
    """The entry of a call: its owner, where and what it asks, canonicalised."""
    asked = {name: value for name, value in body.items() if name not in NOT_KEYED}
    keyed: dict[str, Any] = {"org": org_id, "key": key_id, "endpoint": endpoint}
    keyed.update(ceiling=ceiling, body={**asked, "model": model})
    return hashlib.sha256(orjson.dumps(keyed, option=orjson.OPT_SORT_KEYS)).hexdigest()


def deterministic(body: dict[str, Any]) -> bool:
    """A call whose answer is meant to repeat: temperature 0 or a seed."""
    return body.get("temperature") == 0 or body.get("seed") is not None


@dataclass(frozen=True, slots=True)
class Hit:
    """A stored answer: its entry (see :func:`_entry`), the request that paid for it and
    what that cost (nano-USD)."""

    entry: dict[str, Any]
    request_id: str
    cost_nanos: int


def _hit_of(row: dict[str, Any] | None, now: float) -> Hit | None:
    if row is None or row["state"] != cache_entries.STORED or row["expires_at"] <= now:
        return None
    return Hit(row["entry"], row["request_id"], int(row["cost_nanos"] or 0))


@dataclass(eq=False)
class _Flight:
    """A call of this process asking the provider for a key; its waiters wait on ``done``
    and read ``hit`` (None: it failed, each waiter makes its own call)."""

    done: trio.Event = field(default_factory=trio.Event)
    hit: Hit | None = None


@dataclass(eq=False)
class Ticket:
    """What the cache did with one call, and what the call leaves it when it settles."""

    cache: ResponseCache | None
    result: str
    key: str = ""
    #: the model the call resolved to
    model: Model | None = None
    hit: Hit | None = None
    #: the call asks for the key: this process's waiters wait for it
    flight: _Flight | None = None
    #: the call holds the key's claim row (other processes wait for it)
    claimed: bool = False
    #: the answer to store once the call settled well (set by the walk)
    entry: dict[str, Any] | None = None
    #: a streamed miss: what its pump read
    recorder: Recording | None = None

    #: a miss's answer, stored with its settlement (what a waiter of this process serves)
    stored: Hit | None = None

    def to_store(
        self, call: Call, settlement: Settlement, usage: Usage | None, ok: bool
    ) -> tuple[Any, ...] | None:
        """The entry a miss that completed (``ok``) stores, written in its settlement's
        transaction (:func:`gateway.store.cache_entries.settle_and_store`): one commit."""
        cache = self.cache
        if cache is None or self.result != MISS or not ok:
            return None
        if self.recorder is not None and call.hold is not None:
            self.entry = self.recorder.entry(call.hold.model.id)
        entry = self.entry
        if entry is None:
            return None
        if usage is not None:
            entry["usage"] = records.usage_row(
                usage.prompt_tokens,
                usage.completion_tokens,
                usage.total_tokens,
                usage.cached_tokens,
                usage.cache_write_tokens,
            )
        self.stored = Hit(entry, call.request_id, settlement.cap_nanos)
        now = cache.clock.now()
        expires = now + cache.config.ttl_s
        org_id, cost = call.record.org_id, settlement.cap_nanos
        return (self.key, org_id, now, expires, call.request_id, cost, entry)

    async def settled(self, call: Call) -> None:
        """The call settled: its waiters served what it stored, or its claim dropped."""
        if self.cache is not None and self.result == MISS:
            await self.cache.settled(self, call)


class ResponseCache:
    """The cache of one server process: its settings, the store, this process's flights."""

    def __init__(
        self,
        config: CacheConfig,
        store: Store,
        clock: Clock,
        metrics: CacheMetrics | None,
        *,
        shared: bool,
    ) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self.metrics = metrics
        #: other processes (workers, nodes) use the same entries: a miss claims its key
        #: in the store; alone, this process's flights are every call there is
        self.shared = shared
        self._flights: dict[str, _Flight] = {}

    # -- the step ------------------------------------------------------------------------

    async def look(
        self,
        call: Call,
        body: dict[str, Any],
        model: Model,
        ceiling: int,
        control: str | None,
    ) -> Ticket:
        """The ticket of a resolved call (set on it): a hit to serve, a miss to call and
        store, or a bypass."""
        ticket = await self._look(call, body, model, ceiling, control)
        if ticket.hit is not None and not _serves(ticket.hit, call.stream):
            ticket = Ticket(self, MISS, ticket.key)  # stored in a form this call cannot use
        ticket.model = model
        call.cache = ticket
        if self.metrics is not None:
            saved = ticket.hit.cost_nanos if ticket.hit is not None else 0
            self.metrics.cache_result(ticket.result, saved)
        return ticket

    async def _look(
        self, call: Call, body: dict[str, Any], model: Model, ceiling: int, control: str | None
    ) -> Ticket:
        record, config = call.record, self.config
        directives = {part.strip().lower() for part in (control or "").split(",")}
        if (
            not config.enabled
            or record.data_mode == "zero_retention"
            or "no-store" in directives
            or (
                config.mode == "deterministic"
                and call.endpoint != "embeddings"
                and not deterministic(body)
            )
        ):
            return Ticket(None, BYPASS)
        key_id = record.id if config.scope == "key" else None
        key = cache_key(record.org_id, key_id, call.endpoint, model.id, ceiling, body)
        if "no-cache" in directives:
            return Ticket(self, MISS, key)  # not served from the cache; its answer is stored
        try:
            return await self._hit_or_claim(call, key)
        except StoreError:
            return Ticket(None, BYPASS)  # a cache the store cannot reach is skipped

    async def _hit_or_claim(self, call: Call, key: str) -> Ticket:
        flight = self._flights.get(key)
        if flight is not None:
            # a call of this process is asking for it: wait for it, up to our deadline
            with trio.move_on_at(call.deadline):
                await flight.done.wait()
            if flight.hit is not None:
                return Ticket(self, HIT, key, hit=flight.hit)
            return Ticket(self, MISS, key)
        flight = self._flights[key] = _Flight()
        try:
            # a read first: a hit (the common case of a warm entry) writes nothing
            hit = _hit_of(await self.store.read(cache_entries.lookup, key), self.clock.now())
            claimed = hit is None and not self.shared
            if hit is None and self.shared:
                held = await self._claim(call, key)
                claimed = held is None
                if held is not None:
                    hit = await self._wait_for(held, call, key)
        except BaseException:
            self._land(key, flight, None)
            raise
        if claimed:
            return Ticket(self, MISS, key, flight=flight, claimed=self.shared)
        self._land(key, flight, hit)
        if hit is not None:
            return Ticket(self, HIT, key, hit=hit)
        # another process's call failed, or ran out of time: ours is a miss of its own
        return Ticket(self, MISS, key)

    async def _claim(self, call: Call, key: str) -> dict[str, Any] | None:
        """Claim ``key`` in the store for ``call`` until its deadline (None), else the
        row that holds it: another process's claim, or the entry it stored since."""
        now = self.clock.now()
        row = await self.store.write(
            cache_entries.claim,
            key,
            call.record.org_id,
            call.request_id,
            now,
            now + call.remaining(),
        )
        return row

    async def _wait_for(self, row: dict[str, Any] | None, call: Call, key: str) -> Hit | None:
        """The hit of a key another process holds, once stored; None when its claim is
        dropped (its call failed) or past its time, or at this call's deadline."""
        with trio.move_on_at(call.deadline):
            while row is not None and row["state"] == cache_entries.PENDING:
                if row["expires_at"] <= self.clock.now():
                    return None
                await trio.sleep(POLL_S)
                row = await self.store.read(cache_entries.lookup, key)
        return _hit_of(row, self.clock.now())

    def _land(self, key: str, flight: _Flight, hit: Hit | None) -> None:
        flight.hit = hit
        flight.done.set()
        if self._flights.get(key) is flight:
            del self._flights[key]

    async def settled(self, ticket: Ticket, call: Call) -> None:
        """A miss settled: its waiters of this process land on what it stored; a claim
        it did not store over is dropped (the waiters of other processes then call)."""
        try:
            if ticket.stored is None and ticket.claimed:
                await self.store.write(cache_entries.release, ticket.key, call.request_id)
        except StoreError:
            log.warning("the response cache could not be written", extra=event("store_error"))
        finally:
            if ticket.flight is not None:
                self._land(ticket.key, ticket.flight, ticket.stored)

    # -- bounds --------------------------------------------------------------------------

    async def sweep_forever(self) -> None:
        """Drop expired entries and the oldest past ``max_entries``, every :data:`SWEEP_S`."""
        while True:
            await trio.sleep(min(SWEEP_S, self.config.ttl_s))
            with suppress(StoreError):  # the next sweep tries again
                await self.store.write(
                    cache_entries.sweep, self.clock.now(), self.config.max_entries
                )


def _serves(hit: Hit, stream: bool) -> bool:
    """Whether a stored answer can be rendered for a call with or without a stream (a
    passed-through Anthropic message and its events are kept in the form they came)."""
    form = hit.entry.get("form")
    return not (form == "message" and stream) and not (form == "events" and not stream)
