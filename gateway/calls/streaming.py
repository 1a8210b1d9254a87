"""Streamed model calls: a pump task per stream, and the server-sent-events body.

    provider stream ──► pump (root nursery, deadline) ──► outbox ──► client
                        owns settlement, writes the body     └──── the answer's task:
                                                                    head, keep-alives

Why a separate task: the body must send ``: keep-alive`` every 15 s while the provider
is silent, and an HTTP read cannot be cancelled for a keep-alive and resumed; and the
settlement must not depend on the answer's task, which ends when the client goes. So
the pump reads the provider, and the answer's task sends the head and the first frames,
then hands the body to the pump (:meth:`StreamBody.write_to`): from there the pump
writes the frames of each upstream burst itself, when its next read would wait
(:data:`gateway.providers.http1.BEFORE_WAIT`) or :data:`BUFFER` frames are queued, and
the stream's end once settled, while the answer's task sleeps until the end, woken only
for a keep-alive by one clock task of the server's (:mod:`gateway.calls.keepalive`; no
scope is held across a ``yield``, PEP 789). A batch costs no wake-up of another task
and no hand-over between two (before, each was about a fifth of a paced chunk's work).

Ownership: once handed to the pump, the call's slot and reservation are the pump's to
settle, exactly once, whatever happens:

- the provider finishes: settle from usage, then send the usage chunk and the end;
- the provider fails: settle per the table, then an in-band error (or, when nothing
  was sent yet, the handler answers with a plain HTTP error);
- the deadline passes: settle, then the in-band request_timeout error (in-band even
  when nothing was sent yet: the stream then opens with it, status 200);
- a graceful stop runs out of grace (:mod:`gateway.calls.inflight`): settle, then the in-band
  service_unavailable error;
- the client goes away: the answer's task cancels the pump's scope at once; the pump
  settles (a write of the pump's that must wait for a client that reads nothing is
  ended by its deadline too: the connection is then closed,
  ``gateway/serving/patches/hypercorn_worker.py``);
- an output guardrail denies: the client's stream ends at once with the in-band
  ``content_blocked`` error, then the upstream is read on (nothing more sent) for the
  usage that settles the call (:func:`gateway.calls.guardrails.guarded_stream.read_on`).

The pump never raises: an exception escaping it would cancel the root nursery.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, TypeAlias, cast

import orjson
import trio

from gateway.accounts.usd_json import plain_amounts
from gateway.calls.attempts import Attempts
from gateway.calls.guardrails.guarded_stream import read_on
from gateway.calls.inflight import STOPPING_MESSAGE
from gateway.calls.keepalive import KeepaliveClock
from gateway.calls.lifecycle import Call, finish_reasons
from gateway.calls.parse.messages_answer import MessageStreamTranslator
from gateway.calls.parse.translate import ResponseStreamTranslator
from gateway.calls.provider_errors import map_provider_error
from gateway.calls.routing import Route
from gateway.calls.settlement import Ending
from gateway.errors import GatewayError, in_band
from gateway.providers.anthropic_translate import StreamUsage
from gateway.providers.base import ProviderError, Usage
from gateway.providers.http1 import BEFORE_WAIT

log = logging.getLogger("gateway.calls.streaming")

KEEPALIVE = b": keep-alive\n\n"
DONE = b"data: [DONE]\n\n"
BUFFER = 64
FINAL_SEND_S = 5.0


def sse(data: Any, event: str | None = None) -> bytes:
    """One server-sent event. ``data`` is written as it is: the events of an answer hold
    no USD amount (walking each chunk for one cost a fifth of a chunk's CPU); an error's
    body may, and goes through :func:`error_sse`."""
    if event is None:
        return b"data: " + orjson.dumps(data) + b"\n\n"
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def error_sse(body: dict[str, Any], event: str | None = None) -> bytes:
    """An error event: its amounts (in the svc block's details) in plain decimals."""
    return sse(plain_amounts(body), event)


#: the Messages streams' keep-alive: Anthropic's ``ping`` event
PING = sse({"type": "ping"}, "ping")


class StreamFormat(Protocol):
    """How one endpoint reads its upstream's items (chat chunks, or Anthropic's own
    events on a passthrough) and writes its stream: chat chunks, Responses or Messages
    events."""

    #: what the body sends while the provider is silent
    @property
    def keepalive(self) -> bytes: ...

    def usage(self, item: dict[str, Any]) -> Usage | None:
        """The usage reported so far, when ``item`` reports usage; else None."""
        ...

    def output(self, item: dict[str, Any]) -> bool:
        """Whether ``item`` is part of the answer (handed to :meth:`chunk`)."""
        ...

    def answered(self, item: dict[str, Any]) -> tuple[Any, list[str]]:
        """The model and the finish reasons ``item`` names (for the attempt's span)."""
        ...

    def chunk(self, item: dict[str, Any]) -> list[bytes]: ...

    def finish(self) -> list[bytes]:
        """The stream's last frames, once the call is settled."""
        ...

    def error(self, error: GatewayError) -> list[bytes]: ...

    def served_by(self, model_id: str) -> None:
        """A fallback model serves the call (before its first chunk): the answer names it."""


#: what the pump hands the body: bytes of the stream, or a failure before anything was
#: sent (the handler answers it as an HTTP error); no object around the bytes of each chunk
Frame: TypeAlias = bytes | GatewayError


#: writes frames as a body message of the answer (``final``: its last)
Writer: TypeAlias = Callable[[list[Frame], bool], Awaitable[None]]


class _Outbox:
    """The frames of a stream's pump, in the order put: handed to the body (the answer's
    task) until it :meth:`attach` es a writer, then written by the pump itself.

    Handed over, it is a list the pump appends to and the body empties, each side waking
    the other only when it waits: a memory channel's ``send_nowait`` and
    ``receive_nowait`` cost ~4.6 k instructions a frame (bench/RESULTS.md). At most
    :data:`BUFFER` frames wait: the pump then waits for room, so a client that reads
    slowly holds the upstream back. Written by the pump, the frames queued go out
    together when the pump's next upstream read would wait (:meth:`before_upstream_wait`),
    when :data:`BUFFER` are queued, or after each item when the provider's reads do not
    say when they wait (:attr:`hooked`); a client that reads slowly holds the pump in
    its write.
    """

    __slots__ = (
        "_body",
        "_due",
        "_pump",
        "clock",
        "closed",
        "ended",
        "flushes",
        "frames",
        "hooked",
        "sending",
        "since",
        "writer",
    )

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        #: the pump is done: no frame follows those queued (written, once attached)
        self.ended = False
        #: the body is done: no frame is taken or written any more
        self.closed = False
        self._body: trio.lowlevel.Task | None = None  # waiting for a frame, or the end
        self._pump: trio.lowlevel.Task | None = None  # waiting for room
        #: the keep-alive clock's tick of the body's last write (its park, or a pump's
        #: write once attached), and whether the clock woke the body
        self.since = 0
        self._due = False
        #: the pump writes (set once the head and the first frames went out)
        self.writer: Writer | None = None
        self.clock: KeepaliveClock | None = None
        #: the pump is in a write; and the writes it made so far
        self.sending = False
        self.flushes = 0
        #: the provider's reads call :meth:`before_upstream_wait` (its client sets it)
        self.hooked = False

    # -- the pump's side

    def put(self, frame: Frame) -> bool:
        """Queue ``frame``; True when the outbox is full (await :meth:`room`).
        ``trio.BrokenResourceError`` once the body is closed."""
        if self.closed:
            raise trio.BrokenResourceError("the stream's body is closed")
        self.frames.append(frame)
        if self._body is not None and self.writer is None:
            self._wake_body()
        return len(self.frames) >= BUFFER

    async def room(self) -> None:
        """Until the queued frames are taken (or written: by this task, once attached),
        or the body closed: BrokenResourceError."""
        if self.writer is not None:
            await self.flush()
        while len(self.frames) >= BUFFER and not self.closed:
            self._pump = trio.lowlevel.current_task()
            await trio.lowlevel.wait_task_rescheduled(self._abort_pump)
        if self.closed:
            raise trio.BrokenResourceError("the stream's body is closed")

    async def before_upstream_wait(self) -> None:
        """:class:`gateway.providers.http1.BeforeWait`: the frames of the reads so far
        go out before the next read waits."""
        if self.writer is not None and self.frames:
            await self.flush()

    async def flush(self) -> None:
        """Write the frames queued (attached only). A write that fails closes the body
        (the client is gone): the pump sees it at its next :meth:`put`, outside the
        provider's read this may run in."""
        frames, self.frames = self.frames, []
        if self.closed or self.ended or self.writer is None or not frames:
            return
        await self._write(self.writer, frames, final=False)

    async def end(self) -> None:
        """The pump is done (once; again is nothing): once attached, the frames queued go
        out as the body's last write; the body is woken to end."""
        if self.ended:
            return
        self.ended = True
        writer = self.writer
        if writer is not None and not self.closed:
            frames, self.frames = self.frames, []
            await self._write(writer, frames, final=True)
        if self._body is not None:
            self._wake_body()

    async def keep_alive(self, clock: KeepaliveClock, interval_s: float, frame: bytes) -> None:
        """The body's, once attached: until the pump is done, ``frame`` after each
        keep-alive interval without a write (none while the pump writes)."""
        while not self.ended:
            due = await self.wait_or_keepalive(clock, interval_s)
            writer = self.writer
            if due and writer is not None and self._idle():
                await self._write(writer, [frame], final=False)

    def _idle(self) -> bool:
        """Attached: the pump neither writes nor is done, and the client is there."""
        return not (self.sending or self.ended or self.closed)

    async def _write(self, writer: Writer, frames: list[Frame], final: bool) -> None:
        self.sending = True
        self.flushes += 1
        if self.clock is not None:
            self.since = self.clock.tick
        try:
            await writer(frames, final)
        except Exception:
            log.debug("a stream's write failed: the client is gone", exc_info=True)
            self.closed = True
        finally:
            self.sending = False

    # -- the body's side

    async def wait(self) -> None:
        """Until a frame is queued or the pump is done (no pass when one is already)."""
        if not self.frames and not self.ended:
            self._body = trio.lowlevel.current_task()
            await trio.lowlevel.wait_task_rescheduled(self._abort_body)

    async def wait_or_keepalive(self, clock: KeepaliveClock, interval_s: float) -> bool:
        """:meth:`wait`, at most a keep-alive interval: True when it passed first.
        Attached, until the pump is done: True when a keep-alive interval passed with no
        write."""
        attached = self.writer is not None
        if self.ended or (self.frames and not attached):
            return False
        if not clock.running:
            flushes = self.flushes
            with trio.move_on_after(interval_s) as waited:
                await self._park()
            return waited.cancelled_caught and self.flushes == flushes
        self.since, self._due = clock.tick, False
        clock.parked.add(self)
        try:
            await self._park()
        finally:
            clock.parked.discard(self)
        return self._due

    async def _park(self) -> None:
        self._body = trio.lowlevel.current_task()
        await trio.lowlevel.wait_task_rescheduled(self._abort_body)

    def keepalive_due(self) -> None:
        """The keep-alive clock's: the body waited an interval (:meth:`wait_or_keepalive`)."""
        if self._body is not None:
            self._due = True
            self._wake_body()

    def take(self) -> list[Frame]:
        frames, self.frames = self.frames, []
        if self._pump is not None:
            self._wake_pump()
        return frames

    def attach(self, writer: Writer, clock: KeepaliveClock) -> None:
        """From now on the pump writes (nothing is queued: the body took it all)."""
        self.writer, self.clock = writer, clock
        self.since = clock.tick

    def close(self) -> None:
        self.closed = True
        if self._pump is not None:
            self._wake_pump()

    def _wake_body(self) -> None:
        task, self._body = self._body, None
        if task is not None:
            trio.lowlevel.reschedule(task)

    def _wake_pump(self) -> None:
        task, self._pump = self._pump, None
        if task is not None:
            trio.lowlevel.reschedule(task)

    def _abort_body(self, _: object) -> trio.lowlevel.Abort:
        self._body = None
        return trio.lowlevel.Abort.SUCCEEDED

    def _abort_pump(self, _: object) -> trio.lowlevel.Abort:
        self._pump = None
        return trio.lowlevel.Abort.SUCCEEDED


#: opens the upstream stream of the attempt under way (its deployment's provider, the
#: call's trace): the provider's chat chunks, or a passthrough's own events
OpenStream = Callable[[], AsyncIterator[dict[str, Any]]]


async def _first_chunk(
    open_stream: OpenStream, route: Route
) -> tuple[dict[str, Any] | None, AsyncIterator[dict[str, Any]]]:
    """One attempt of a stream: opened and read up to its first item (None: it ended
    without one), its rest to read. The attempt's stream is closed if it fails."""
    chunks = open_stream()
    try:
        return await anext(chunks), chunks
    except StopAsyncIteration:
        return None, chunks
    except BaseException:
        await _close(chunks)
        raise


async def pump(
    call: Call,
    attempts: Attempts,
    open_stream: OpenStream,
    fmt: StreamFormat,
    outbox: _Outbox,
    scope: trio.CancelScope,
    answered: trio.Event,
) -> None:
    """``answered`` is set once the handler has answered 200: a failure after that is
    in-band whether or not a chunk was sent, and the record says 200. The attempts
    (deployments, fallbacks) end at the first chunk: from there the stream is never
    retried."""
    usage: Usage | None = None
    failure: GatewayError | None = None
    #: the settlement row of the provider's own failure (None: it did not fail)
    failed_as: Ending | None = None
    produced = sent = False
    #: the HTTP status the client was told once its stream ended before the upstream's
    #: (an output guardrail's deny; None: not yet)
    told: int | None = None
    #: what the provider said of its answer, for the attempt's span (traces on only)
    answered_by: object = None
    reasons: list[str] = []
    BEFORE_WAIT.set(outbox)  # this task's context: its upstream reads
    try:
        try:
            with scope:
                #: the served attempt's stream, and it after its first item: closed here
                opened: list[AsyncIterator[dict[str, Any]]] = []
                try:
                    chunk, rest = await attempts.run(partial(_first_chunk, open_stream))
                    opened.append(rest)
                    attempt = call.attempt  # the served attempt's span
                    if call.fallback_from is not None:
                        fmt.served_by(call.held.model.id)
                    # the first item, then the rest (no generator around both: a layer
                    # of them cost a few µs of every chunk)
                    while chunk is not None:
                        if attempt is not None:
                            model, named = fmt.answered(chunk)
                            answered_by = answered_by or model
                            reasons += named
                        usage = fmt.usage(chunk) or usage
                        if fmt.output(chunk):
                            produced = True
                            for data in fmt.chunk(chunk):
                                # no checkpoint per chunk: the chunks of one upstream read
                                # go out together (the body sends what is queued)
                                if outbox.put(data):
                                    await outbox.room()
                                sent = True
                            if outbox.writer is not None and not outbox.hooked:
                                await outbox.flush()  # its reads never say they wait
                        try:
                            chunk = await rest.__anext__()
                        except StopAsyncIteration:
                            chunk = None
                except ProviderError as exc:
                    failure, failed_as = map_provider_error(exc, byok=call.record.byok)
                    usage = usage or exc.usage  # reported in the stream before it failed
                except GatewayError as exc:  # an output guardrail's deny: content_blocked
                    failure = exc
                    told = _status(failure, sent, answered)
                    await _tell(outbox, fmt, failure, sent)
                    usage = await read_on(opened[-1], fmt.usage, usage)
                finally:
                    for each in opened:
                        await _close(each)
            if scope.cancelled_caught:
                failed_as = None  # our deadline, a graceful stop or the client ended the call
                if told is not None:
                    pass  # the client was told why its stream ended
                elif call.cut_short:
                    failure = GatewayError("service_unavailable", STOPPING_MESSAGE)
                elif not call.client_gone:
                    failure = GatewayError("request_timeout", "The call reached its time limit.")
        except trio.BrokenResourceError:
            call.client_left()
            failed_as = None
        except Exception:
            log.exception("stream pump failed")
            if told is None:
                failure = GatewayError("service_unavailable", "The stream failed.")
            failed_as = None
        if call.attempt is not None:
            call.attempt.answered(answered_by, reasons)
        ending = call.ending(usage=usage, failure=failed_as, produced=produced)
        # the spec: a streamed call's timeout is in-band, even with nothing sent yet (a
        # deadline shorter than the keep-alive interval): its frames open the stream
        in_stream = sent or (failure is not None and failure.code == "request_timeout")
        try:
            await call.finish(
                ending,
                usage=usage,
                http_status=_status(failure, in_stream, answered) if told is None else told,
                error_code=failure.code if failure else None,
            )
        except Exception:
            # the shards stopped under it (a server cancelled whole) or did not answer
            # in time: the settlement row is committed first, the memory is the shards'
            log.exception("stream settlement failed")
        if call.client_gone or told is not None:
            return
        await _tell(outbox, fmt, failure, in_stream)
    finally:
        await outbox.end()


def _status(failure: GatewayError | None, in_stream: bool, answered: trio.Event) -> int:
    """The HTTP status of the call: a failure's own when the handler answers it (nothing
    sent, nothing answered yet), else 200."""
    return failure.status if failure and not (in_stream or answered.is_set()) else 200


async def _tell(
    outbox: _Outbox, fmt: StreamFormat, failure: GatewayError | None, in_stream: bool
) -> None:
    """The stream's last frames, and its end: the failure, or the format's finish."""
    frames: list[Frame] = (
        [failure]
        if failure and not in_stream
        else list(fmt.error(failure) if failure else fmt.finish())
    )
    with suppress(trio.BrokenResourceError):
        for frame in frames:  # a few: held without waiting for room
            outbox.put(frame)
    await outbox.end()


async def _close(chunks: AsyncIterator[dict[str, Any]]) -> None:
    """Close the provider's stream now, not when it is garbage collected.

    The pump can stop while the stream is suspended at a ``yield`` (cancelled while
    waiting to hand a chunk to a client that reads slowly, or the client gone): its
    upstream response must be released at once. Shielded and bounded: the pump may be
    cancelled already.
    """
    aclose = getattr(chunks, "aclose", None)
    if aclose is not None:
        with trio.move_on_after(FINAL_SEND_S, shield=True):
            await aclose()


class StreamBody:
    """A stream's body: served by :meth:`write_to` (the server's connection hands it
    ASGI's ``send``; ``gateway/serving/patches/quart_trio_connection.py``), or iterated,
    an async iterator of its writes, by a server that only iterates bodies."""

    __slots__ = ("_iterated", "call", "first", "fmt", "outbox", "scope")

    def __init__(
        self,
        call: Call,
        outbox: _Outbox,
        fmt: StreamFormat,
        scope: trio.CancelScope,
        first: list[Frame],
    ) -> None:
        self.call, self.outbox, self.fmt, self.scope, self.first = call, outbox, fmt, scope, first
        self._iterated: AsyncIterator[bytes] | None = None

    async def write_to(self, send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        """Send the body's messages (the head is sent): the frames queued so far from
        this task, then the pump writes, and this task sends only keep-alives until the
        pump's last write (the stream's end, after its settlement)."""
        call, outbox, fmt = self.call, self.outbox, self.fmt
        keepalive, clock = call.parts.keepalive_s, call.parts.keepalives

        async def write(frames: list[Frame], final: bool) -> None:
            data = _joined(frames, fmt) if frames else b""
            await send({"type": "http.response.body", "body": data, "more_body": not final})

        ended = False
        try:
            frames = self.first
            while True:  # what the pump queued while this task wrote goes out too
                frames += outbox.take()
                if outbox.ended:
                    await write(frames, True)
                    ended = True
                    return
                if not frames:
                    break
                await write(frames, False)
                frames = []
            outbox.attach(write, clock)
            await outbox.keep_alive(clock, keepalive, fmt.keepalive)
            ended = True
        finally:
            if not ended:
                _client_gone(call, self.scope)
            outbox.close()

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        if self._iterated is None:
            self._iterated = _body(self.call, self.outbox, self.fmt, self.scope, self.first)
        return await anext(self._iterated)

    async def aclose(self) -> None:
        """The iterator's end (a server that iterates closes it once done)."""
        if self._iterated is not None:
            await cast(Any, self._iterated).aclose()
        elif not self.outbox.closed:  # never iterated: as a body that ended unread
            _client_gone(self.call, self.scope)
            self.outbox.close()


async def _body(
    call: Call,
    outbox: _Outbox,
    fmt: StreamFormat,
    scope: trio.CancelScope,
    first: list[Frame],
) -> AsyncIterator[bytes]:
    """:class:`StreamBody` iterated: each write waited for here, keep-alives too."""
    keepalive, clock = call.parts.keepalive_s, call.parts.keepalives
    ended = False
    try:
        frames = first
        while True:
            if frames:
                # every frame queued goes out in one write
                yield _joined(frames, fmt)
            elif outbox.ended:
                ended = True
                return
            if await outbox.wait_or_keepalive(clock, keepalive):
                yield fmt.keepalive
            frames = outbox.take()
    finally:
        if not ended:
            _client_gone(call, scope)
        outbox.close()


def _client_gone(call: Call, scope: trio.CancelScope) -> None:
    """The answer ended before the stream: the client left, unless the pump's call had
    ended already (its deadline or a graceful stop's cut; a write cut by either closes
    the connection, and the record says which)."""
    if not scope.cancel_called:
        call.client_left()
        scope.cancel()


def _joined(frames: list[Frame], fmt: StreamFormat) -> bytes:
    try:
        return b"".join(cast(list[bytes], frames))  # bytes, but for a failure (rare)
    except TypeError:
        return b"".join([data for frame in frames for data in _frame_bytes(frame, fmt)])


def _frame_bytes(frame: Frame, fmt: StreamFormat) -> list[bytes]:
    """A new list: the caller may extend it."""
    return fmt.error(frame) if isinstance(frame, GatewayError) else [frame]


@dataclass(frozen=True, slots=True)
class EventStream:
    """The answer of a stream: its body (server-sent events) and headers, for the route
    to send as a ``text/event-stream`` answer with status 200."""

    body: AsyncIterator[bytes]
    headers: dict[str, str]


async def start_stream(
    call: Call, attempts: Attempts, open_stream: OpenStream, fmt: StreamFormat
) -> EventStream:
    """Hand the call to a pump and return the event stream to answer; ``open_stream``
    opens the upstream stream of each attempt (the provider's chat chunks, or a native
    passthrough's events, as ``fmt`` reads them).

    Waits up to one keep-alive interval for the first frame, so that a refusal that
    comes before anything is produced is answered with its real HTTP status; when none
    came, the body starts with a keep-alive.
    """
    nursery = call.parts.nursery()
    assert nursery is not None
    outbox = _Outbox()
    await call.start_provider_call()
    scope = call.watch(trio.CancelScope(deadline=call.deadline))
    call.hand_off()
    answered = trio.Event()
    nursery.start_soon(pump, call, attempts, open_stream, fmt, outbox, scope, answered)
    try:
        with trio.move_on_after(call.parts.keepalive_s):
            await outbox.wait()
    except BaseException:
        call.client_left()
        scope.cancel()
        outbox.close()
        raise
    first = outbox.take()
    if first and isinstance(first[0], GatewayError):
        outbox.close()
        raise first[0]
    if not first:
        # a keep-alive interval passed without a byte: the body opens with a keep-alive,
        # else the first one would come only after a second interval
        first.append(fmt.keepalive)
    answered.set()
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return EventStream(StreamBody(call, outbox, fmt, scope, first), headers)


class ChatChunks:
    """How the chat-shaped formats read their upstream: ``chat.completion.chunk``
    objects, the one with ``usage`` kept without its choices (those are passed on as
    any chunk's) for :meth:`finish`."""

    usage_chunk: dict[str, Any] | None = None

    def usage(self, chunk: dict[str, Any]) -> Usage | None:
        if not chunk.get("usage"):
            return None
        self.usage_chunk = {**chunk, "choices": []}
        return Usage.reported(chunk["usage"])

    def output(self, chunk: dict[str, Any]) -> bool:
        return bool(chunk.get("choices"))

    def answered(self, chunk: dict[str, Any]) -> tuple[Any, list[str]]:
        return chunk.get("model"), finish_reasons(chunk)


class ChatFormat(ChatChunks):
    """OpenAI chat.completion.chunk events, ``[DONE]``; usage chunk only when asked for.

    Every chunk carries the svc block, as a non-streamed answer does. Usage travels
    only in the final usage chunk, whatever chunk the upstream put it in.
    """

    keepalive = KEEPALIVE

    def __init__(self, model_id: str, include_usage: bool, svc: dict[str, Any]) -> None:
        self.model_id = model_id
        self.include_usage = include_usage
        self.svc = svc

    def chunk(self, chunk: dict[str, Any]) -> list[bytes]:
        out = chunk.copy()
        out.pop("usage", None)
        out["model"], out["svc"] = self.model_id, self.svc
        return [sse(out)]

    def finish(self) -> list[bytes]:
        frames = []
        if self.include_usage and self.usage_chunk is not None:
            final = {**self.usage_chunk, "model": self.model_id, "choices": [], "svc": self.svc}
            frames.append(sse(final))
        frames.append(DONE)
        return frames

    def error(self, error: GatewayError) -> list[bytes]:
        return [error_sse({"error": in_band(error)}), DONE]

    def served_by(self, model_id: str) -> None:
        self.model_id = model_id


class ResponsesFormat(ChatChunks):
    """Responses API events (``event:`` + ``data:``), translated from chat chunks."""

    keepalive = KEEPALIVE

    def __init__(self, translator: ResponseStreamTranslator) -> None:
        self.translator = translator
        self.started = False

    def _start(self) -> list[dict[str, Any]]:
        if self.started:
            return []
        self.started = True
        return self.translator.start()

    def _frames(self, events: list[dict[str, Any]]) -> list[bytes]:
        return [sse(event, event["type"]) for event in events]

    def chunk(self, chunk: dict[str, Any]) -> list[bytes]:
        return self._frames(self._start() + self.translator.feed(chunk))

    def finish(self) -> list[bytes]:
        events = self._start()
        if self.usage_chunk is not None:
            events += self.translator.feed(self.usage_chunk)
        return self._frames(events + self.translator.finish())

    def error(self, error: GatewayError) -> list[bytes]:
        failed = self.translator.failed(error.code, error.message or error.spec.message)
        return self._frames([*self._start(), failed])

    def served_by(self, model_id: str) -> None:
        self.translator.served_by(model_id)


class MessagesFormat(ChatChunks):
    """Anthropic Messages events (``event:`` + ``data:``), translated from chat chunks;
    ``ping`` events are the keep-alive, and a failure is an ``error`` event in
    Anthropic's error dialect, as Anthropic sends them."""

    keepalive = PING

    def __init__(self, translator: MessageStreamTranslator) -> None:
        self.translator = translator
        self.started = False

    def _frames(self, events: list[dict[str, Any]]) -> list[bytes]:
        if not self.started:
            self.started = True
            events = self.translator.start() + events
        return [sse(event, event["type"]) for event in events]

    def chunk(self, chunk: dict[str, Any]) -> list[bytes]:
        return self._frames(self.translator.feed(chunk))

    def finish(self) -> list[bytes]:
        events = [] if self.usage_chunk is None else self.translator.feed(self.usage_chunk)
        return self._frames(events + self.translator.finish())

    def error(self, error: GatewayError) -> list[bytes]:
        return [*self._frames([]), error_sse(error.anthropic_body(), "error")]

    def served_by(self, model_id: str) -> None:
        self.translator.served_by(model_id)


class NativeMessagesFormat:
    """Anthropic's own events, relayed (a ``/v1/messages`` call passed through to an
    ``anthropic`` deployment): ``message_start`` carries the gateway's message id, the
    public model id and the svc block; ``message_delta`` (the stop reason, the stop
    sequence, the final usage) and ``message_stop`` are held until the call is settled,
    as every stream's end is; the upstream's ``ping`` events are dropped (the keep-alive
    is the gateway's own, :data:`PING`). The usage that settles the call is read from
    ``message_start`` and ``message_delta``, cache counts included."""

    keepalive = PING

    def __init__(self, message_id: str, model_id: str, svc: dict[str, Any]) -> None:
        self.message_id = message_id
        self.model_id = model_id
        self.svc = svc
        self.counted = StreamUsage()
        self.held: list[dict[str, Any]] = []

    def usage(self, event: dict[str, Any]) -> Usage | None:
        return self.counted.usage if self.counted.read(event) else None

    def output(self, event: dict[str, Any]) -> bool:
        return event.get("type") != "ping"

    def answered(self, event: dict[str, Any]) -> tuple[Any, list[str]]:
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message")
            return (message.get("model") if isinstance(message, dict) else None), []
        if kind == "message_delta":
            reason = (event.get("delta") or {}).get("stop_reason")
            return None, [reason] if isinstance(reason, str) else []
        return None, []

    def chunk(self, event: dict[str, Any]) -> list[bytes]:
        kind = str(event.get("type"))
        if kind == "message_start":
            message = event.get("message")
            message = {
                **(message if isinstance(message, dict) else {}),
                "id": self.message_id,
                "model": self.model_id,
                "svc": self.svc,
            }
            return [sse({**event, "message": message}, kind)]
        if kind in ("message_delta", "message_stop"):
            self.held.append(event)
            return []
        return [sse(event, kind)]

    def finish(self) -> list[bytes]:
        events = [event for event in self.held if event.get("type") == "message_delta"]
        return [sse(event, "message_delta") for event in events] + [
            sse({"type": "message_stop"}, "message_stop")
        ]

    def error(self, error: GatewayError) -> list[bytes]:
        return [error_sse(error.anthropic_body(), "error")]

    def served_by(self, model_id: str) -> None:
        self.model_id = model_id


class PerAttemptFormat:
    """A ``/v1/messages`` stream whose deployments differ in kind: relayed as Anthropic's
    own events when the attempt that serves passes the call through (an ``anthropic``
    deployment), translated from chat chunks otherwise. The opener of each attempt says
    which (:meth:`passing_through`), before the attempt's first item is read; both keep
    alive with ``ping`` and fail with an ``error`` event."""

    keepalive = PING

    def __init__(self, translated: StreamFormat, native: NativeMessagesFormat) -> None:
        self.translated = translated
        self.native = native
        self.current: StreamFormat = translated

    def passing_through(self, native: bool) -> None:
        self.current = self.native if native else self.translated

    def usage(self, item: dict[str, Any]) -> Usage | None:
        return self.current.usage(item)

    def output(self, item: dict[str, Any]) -> bool:
        return self.current.output(item)

    def answered(self, item: dict[str, Any]) -> tuple[Any, list[str]]:
        return self.current.answered(item)

    def chunk(self, item: dict[str, Any]) -> list[bytes]:
        return self.current.chunk(item)

    def finish(self) -> list[bytes]:
        return self.current.finish()

    def error(self, error: GatewayError) -> list[bytes]:
        return self.current.error(error)

    def served_by(self, model_id: str) -> None:
        self.current.served_by(model_id)
