"""The walk's side of the cache: what a miss keeps to store, and how a hit is answered
(its stored answer under the call's own ids, a stream replayed through the endpoint's
format) and recorded (settled 0, naming the original and what it saved)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from gateway.accounts.catalog import Model
from gateway.calls.cache.chunking import chunks_completion, completion_chunks
from gateway.calls.cache.lookup import HIT, MISS, Hit, Ticket
from gateway.calls.cache.recording import Recording
from gateway.calls.lifecycle import Call
from gateway.calls.parse import ChatCall
from gateway.calls.settlement import Ending
from gateway.calls.streaming import EventStream, NativeMessagesFormat, StreamFormat
from gateway.store import StoreError, cache_entries

log = logging.getLogger("gateway.calls.cache")


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


def recording(call: Call, fmt: StreamFormat, svc: dict[str, Any]) -> StreamFormat:
    """``fmt``, keeping what it reads when the call is a miss to store."""
    ticket = call.cache
    if not isinstance(ticket, Ticket) or ticket.result != MISS:
        return fmt
    ticket.recorder = Recording(fmt, svc)
    return ticket.recorder
