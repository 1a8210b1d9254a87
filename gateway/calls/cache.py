"""The response cache: a step of the walk between resolving a call (6) and reserving (8).

    prepare()  6 resolve ──► look()  hit ──────────────► serve_hit(): the stored answer
                                │                         (a stream replays its chunks),
                                │                         its own record, settled 0
                                ├─ miss, the key claimed ──► 8 reserve, 9 call … 10 settle
                                │                         └─► Ticket.settled(): stored
                                │                             (ok) or the claim dropped
                                ├─ claimed by another call: wait (an event in this process,
                                │  the claim row polled across workers and nodes), then a hit,
                                │  or a miss of its own when the first failed
                                └─ bypass (off, zero_retention, not deterministic,
                                   ``Cache-Control: no-store``, the store unreachable)

The key (:func:`cache_key`): the organisation (and the key with ``scope = "key"``), the
endpoint, the resolved model, the effective output ceiling and every field of the body
but those that cannot change the answer (:data:`NOT_KEYED`), canonicalised by orjson
with sorted keys. A stream and a call without one share an entry: the answer is stored
as the chat chunks or the completion it came as, and rendered in either form
(:mod:`gateway.calls.cache_forms`).

Money: a hit reserves nothing and settles 0; its record names the original request and
what it saved (the original's settled cost). Only an answer that completed is stored
(a length-truncated one is); a failure, a cut stream, a client that left store nothing.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

import orjson
import trio

from gateway.accounts.catalog import Model
from gateway.calls.cache_forms import chunks_completion, completion_chunks
from gateway.calls.lifecycle import Call
from gateway.calls.parse import ChatCall
from gateway.calls.settlement import Ending, Settlement
from gateway.calls.streaming import (
    EventStream,
    NativeMessagesFormat,
    PerAttemptFormat,
    StreamFormat,
)
from gateway.config.cache import CacheConfig
from gateway.errors import GatewayError
from gateway.observe.logs import event
from gateway.providers.base import Usage
from gateway.store import StoreError, cache_entries, records
from shards.clock import Clock

if TYPE_CHECKING:
    from gateway.store import Store

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
    #: the call holds the key's claim (its waiters are waiting for it)
    flight: _Flight | None = None
    #: the answer to store once the call settled well (set by the walk)
    entry: dict[str, Any] | None = None
    #: a streamed miss: what its pump read
    recorder: Recording | None = None

    async def settled(
        self, call: Call, settlement: Settlement, usage: Usage | None, ok: bool
    ) -> None:
        """The call settled: its answer stored when it completed, else its claim dropped."""
        cache = self.cache
        if cache is None or self.result != MISS:
            return
        if self.recorder is not None and call.hold is not None:
            self.entry = self.recorder.entry(call.hold.model.id)
        entry = self.entry if ok else None
        if entry is not None and usage is not None:
            entry["usage"] = records.usage_row(
                usage.prompt_tokens,
                usage.completion_tokens,
                usage.total_tokens,
                usage.cached_tokens,
                usage.cache_write_tokens,
            )
        await cache.settled(self, call, entry, settlement.cap_nanos)


class ResponseCache:
    """The cache of one server process: its settings, the store, this process's flights."""

    def __init__(
        self, config: CacheConfig, store: Store, clock: Clock, metrics: CacheMetrics | None
    ) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self.metrics = metrics
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
            claimed, hit = await self._claim(call, key)
        except BaseException:
            self._land(key, flight, None)
            raise
        if claimed:
            return Ticket(self, MISS, key, flight=flight)
        self._land(key, flight, hit)
        if hit is not None:
            return Ticket(self, HIT, key, hit=hit)
        # another process's call failed, or ran out of time: ours is a miss of its own
        return Ticket(self, MISS, key)

    async def _claim(self, call: Call, key: str) -> tuple[bool, Hit | None]:
        """Claim ``key`` for ``call`` (True), or the hit it holds; a key claimed by
        another process is read again until it is stored or dropped."""
        now = self.clock.now()
        row = await self.store.write(
            cache_entries.claim,
            key,
            call.record.org_id,
            call.request_id,
            now,
            now + call.remaining(),
        )
        if row is None:
            return True, None
        with trio.move_on_at(call.deadline):
            while row is not None and row["state"] == cache_entries.PENDING:
                if row["expires_at"] <= self.clock.now():
                    return False, None
                await trio.sleep(POLL_S)
                row = await self.store.read(cache_entries.lookup, key)
        return False, _hit_of(row, self.clock.now())

    def _land(self, key: str, flight: _Flight, hit: Hit | None) -> None:
        flight.hit = hit
        flight.done.set()
        if self._flights.get(key) is flight:
            del self._flights[key]

    async def settled(
        self, ticket: Ticket, call: Call, entry: dict[str, Any] | None, cost_nanos: int
    ) -> None:
        """A miss settled: its answer stored (``entry``), or its claim dropped."""
        now = self.clock.now()
        hit = Hit(entry, call.request_id, cost_nanos) if entry is not None else None
        try:
            if hit is not None and entry is not None:
                await self.store.write(
                    cache_entries.put,
                    ticket.key,
                    call.record.org_id,
                    now,
                    now + self.config.ttl_s,
                    call.request_id,
                    cost_nanos,
                    entry,
                )
            elif ticket.flight is not None:
                await self.store.write(cache_entries.release, ticket.key, call.request_id)
        except StoreError:
            log.warning("the response cache could not be written", extra=event("store_error"))
        finally:
            if ticket.flight is not None:
                self._land(ticket.key, ticket.flight, hit)

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


def completion_of(hit: Hit) -> dict[str, Any] | None:
    """A stored chat answer as a completion (None: the entry is not a chat answer)."""
    entry = hit.entry
    if entry.get("form") == "completion":
        return dict(entry["completion"])
    if entry.get("form") == "chunks":
        return chunks_completion(entry["chunks"])
    return None


def chunks_of(hit: Hit) -> list[dict[str, Any]] | None:
    """A stored chat answer as stream chunks (the original's, when it was streamed)."""
    entry = hit.entry
    if entry.get("form") == "chunks":
        return list(entry["chunks"])
    if entry.get("form") == "completion":
        return completion_chunks(entry["completion"])
    return None


# -- the walk's side: what a miss keeps, how a hit is answered ------------------------------


def is_hit(call: Call) -> bool:
    """The call is served from the cache (it asks no provider)."""
    ticket = call.cache
    return isinstance(ticket, Ticket) and ticket.hit is not None


def keep(call: Call, form: str, body: dict[str, Any], ignored: list[str], model: str) -> None:
    """A miss's answer, to store once the call settled well."""
    ticket = call.cache
    if isinstance(ticket, Ticket) and ticket.result == MISS:
        ticket.entry = {"form": form, form: {**body}, "ignored": ignored, "model": model}


class Rendering(Protocol):
    """What answering a hit asks of its endpoint (:class:`gateway.calls.pipeline.Endpoint`)."""

    @property
    def answer(self) -> Callable[[Call, ChatCall, dict[str, Any]], dict[str, Any]] | None: ...
    @property
    def stream_format(self) -> Callable[[Call, ChatCall, dict[str, Any]], StreamFormat] | None: ...


def _svc(call: Call, hit: Hit) -> dict[str, Any]:
    """A hit's svc block: its own request id, the original's ignored parameters, and
    the request it was served from."""
    return {
        "request_id": call.request_id,
        "ignored_parameters": hit.entry.get("ignored", []),
        "cache": {"status": HIT, "original_request_id": hit.request_id},
    }


def _message_id(call: Call) -> str:
    return "msg_" + call.request_id.removeprefix("req_")


async def record_hit(call: Call, model: Model, hit: Hit) -> None:
    """A hit's own record (settled 0, naming the original and what it saved); the
    call then settles as not called: its slot released, nothing reserved."""
    created = datetime.fromtimestamp(call.started, UTC)
    row = {
        "id": call.request_id,
        "key_id": call.record.id,
        "parent_id": call.record.parent_id,
        "org_id": call.record.org_id,
        "created": call.started,
        "day": created.strftime("%Y-%m-%d"),
        "month": created.strftime("%Y-%m"),
        "endpoint": call.endpoint,
        "model": hit.entry.get("model", model.id),
        "provider": "cache",
        "status": "succeeded",
        "http_status": 200,
        "stream": int(call.stream),
        "tags": call.tags,
        "usage": hit.entry.get("usage"),
        "estimated_usd_nanos": 0,
        "reserved_usd_nanos": 0,
        "settled_usd_nanos": 0,
        "billed_usd_nanos": 0,
        "latency_ms": round((call.parts.clock.now() - call.started) * 1000, 3),
        "error_code": None,
        "mode": call.record.mode,
        "trace_id": call.trace.trace_id if call.trace else None,
        "node_id": call.parts.node_id,
        "cache": HIT,
        "cache_of": hit.request_id,
        "saved_usd_nanos": hit.cost_nanos,
    }
    try:
        await call.parts.store.write(cache_entries.record_hit, row, must_land=True)
    except StoreError:
        log.error("the record of cache hit %s is queued", call.request_id)
    await call.finish(Ending.NOT_CALLED)


def _hit(call: Call) -> tuple[Hit, Model]:
    ticket = call.cache
    assert isinstance(ticket, Ticket) and ticket.hit is not None and ticket.model is not None
    return ticket.hit, ticket.model


async def answer_hit(call: Call, endpoint: Rendering, parsed: Any) -> dict[str, Any]:
    """A hit without a stream: the stored answer under this call's ids, recorded."""
    hit, model = _hit(call)
    served = str(hit.entry.get("model", model.id))
    svc = _svc(call, hit)
    form = hit.entry.get("form")
    if form == "embedding":
        answer = {**hit.entry["embedding"], "svc": svc}
    elif form == "message":
        answer = {**hit.entry["message"], "id": _message_id(call), "model": served, "svc": svc}
    else:
        completion = completion_of(hit)
        assert completion is not None and endpoint.answer is not None
        answer = endpoint.answer(call, parsed, {**completion, "model": served})
        answer["svc"] = svc
    await record_hit(call, model, hit)
    return answer


async def replay_hit(call: Call, endpoint: Rendering, chat: ChatCall) -> EventStream:
    """A streamed hit: the stored chunks replayed through the endpoint's stream format
    (the usage chunk and the end as a stream's), recorded."""
    hit, model = _hit(call)
    assert endpoint.stream_format is not None
    served = str(hit.entry.get("model", model.id))
    svc = _svc(call, hit)
    fmt: StreamFormat
    if hit.entry.get("form") == "events":
        fmt = NativeMessagesFormat(_message_id(call), served, svc)
        items = list(hit.entry["events"])
    else:
        fmt = endpoint.stream_format(call, chat, svc)
        fmt.served_by(served)
        items = chunks_of(hit) or []
    frames: list[bytes] = []
    for item in items:
        fmt.usage(item)
        if fmt.output(item):
            frames += fmt.chunk(item)
    frames += fmt.finish()
    await record_hit(call, model, hit)
    return EventStream(_frames(frames), {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _frames(frames: list[bytes]) -> AsyncIterator[bytes]:
    for frame in frames:
        yield frame


class Recording:
    """A stream format that keeps every upstream item of a miss (the pump reads each
    one's usage first), to store once the stream completed."""

    def __init__(self, fmt: StreamFormat, svc: dict[str, Any]) -> None:
        self.fmt = fmt
        self.keepalive = fmt.keepalive
        self.svc = svc
        self.items: list[dict[str, Any]] = []

    def entry(self, model: str) -> dict[str, Any]:
        """What the stream read, as an entry: Anthropic's events when the attempt that
        served passed the call through, else chat chunks."""
        fmt = self.fmt
        native = isinstance(fmt, PerAttemptFormat) and fmt.current is fmt.native
        form = "events" if native else "chunks"
        ignored = self.svc.get("ignored_parameters", [])
        return {"form": form, form: self.items, "ignored": ignored, "model": model}

    def usage(self, item: dict[str, Any]) -> Usage | None:
        self.items.append(item)
        return self.fmt.usage(item)

    def output(self, item: dict[str, Any]) -> bool:
        return self.fmt.output(item)

    def answered(self, item: dict[str, Any]) -> tuple[Any, list[str]]:
        return self.fmt.answered(item)

    def chunk(self, item: dict[str, Any]) -> list[bytes]:
        return self.fmt.chunk(item)

    def finish(self) -> list[bytes]:
        return self.fmt.finish()

    def error(self, error: GatewayError) -> list[bytes]:
        return self.fmt.error(error)

    def served_by(self, model_id: str) -> None:
        self.fmt.served_by(model_id)


def recording(call: Call, fmt: StreamFormat, svc: dict[str, Any]) -> StreamFormat:
    """``fmt``, keeping what it reads when the call is a miss to store."""
    ticket = call.cache
    if not isinstance(ticket, Ticket) or ticket.result != MISS:
        return fmt
    ticket.recorder = Recording(fmt, svc)
    return ticket.recorder
