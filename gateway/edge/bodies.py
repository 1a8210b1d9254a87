"""Request bodies: read only when a handler asks, within a deadline and a shared budget.

Why: Quart-Trio reads every request body into memory as it arrives, before any handler
runs and whether or not one ever wants it. A 401 decided from the headers still had its
body buffered, and a client trickling a body held its connection until the call's time
limit. Here :class:`BodyGateMiddleware` sits between the server and Quart:

1. A request whose headers announce a body gets a :class:`BodyGate`. Until a handler
   decides, nothing of the body is taken from the server: Quart's receiving task waits,
   the server's small per-request queue fills, and TCP holds the client back.
2. A handler that has authenticated the request (headers only) calls :meth:`BodyGate.read`:
   a body over ``SMALL_BODY`` first reserves its bytes in the server-wide
   :class:`BodyBudget` (it waits for room, unread, up to ``body_timeout_s``; past that
   503 ``service_unavailable``, retryable), then every body is read under the size
   limit (413) and the deadline (408 ``request_body_timeout``).
3. Every other answer discards the body (:meth:`BodyGate.discard`): read and dropped,
   never kept, under the same deadline, so a kept-alive connection stays usable. A body
   too large, too slow or cut off makes the answer close the connection instead.

The deadline: a body must arrive whole within ``body_timeout_s`` of the first read,
and, past a grace of ``MIN_RATE_GRACE_S``, at no less than ``MIN_RATE`` bytes a second
on average: at any moment the allowance is ``min(body_timeout_s, grace + received /
MIN_RATE)``. A trickling client is cut after a few seconds; a large body on a slow but
real link has the whole ``body_timeout_s``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from gateway.edge.asgi import (
    App,
    Message,
    Receive,
    ReceiveNow,
    Scope,
    Send,
    Watch,
    disconnect_watch,
    receive_now,
    set_disconnect_watch,
)
from gateway.errors import GatewayError

if TYPE_CHECKING:
    from quart import Request

    from gateway.config.settings import ServerConfig

#: bytes a second a body must average once the grace has passed
MIN_RATE = 1024
MIN_RATE_GRACE_S = 5.0
#: a body up to this size is not counted in the budget: at most ``max_connections`` of
#: them are read at once, so they are bounded already, and a request with a usual body
#: (a long stream included) never waits for room
SMALL_BODY = 64 * 1024
#: large refused bodies read and dropped at once
DISCARDS = 4
#: the scope key under which the middleware hands a request's gate to the app
SCOPE_KEY = "svc.body_gate"


class BodyBudget:
    """Bytes of request bodies held at once, across every request of the server.

    A body over ``SMALL_BODY`` holds its share from the moment it is reserved until its
    request has been answered (its parsed form lives as long as the call). Never more
    than ``limit`` is held: a reservation waits for room, bounded by a deadline.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._freed = trio.Event()
        #: large bodies being read only to be dropped (see BodyGate.discard)
        self.discarding = trio.CapacityLimiter(DISCARDS)

    async def take(self, size: int, deadline: float) -> bool:
        """Reserve ``size`` bytes, waiting for room until ``deadline``; False past it."""
        while self.held + size > self.limit:
            if trio.current_time() >= deadline:
                return False
            with trio.move_on_at(deadline):
                await self._freed.wait()
        self.held += size
        return True

    def give(self, size: int) -> None:
        self.held -= size
        self._freed.set()
        self._freed = trio.Event()


def _share(size: int) -> int:
    """What a body of ``size`` bytes counts in the budget."""
    return size if size > SMALL_BODY else 0


class BodyState(enum.Enum):
    HELD = "held"  # announced, not asked for yet: nothing taken from the socket
    READING = "reading"
    READ = "read"  # handed to the handler
    DISCARDED = "discarded"  # read to its end and dropped
    BROKEN = "broken"  # too large, too slow or cut off: the connection must close


class BodyGate:
    """One request's body (see the module docstring)."""

    def __init__(
        self,
        receive: Receive,
        server: ServerConfig,
        budget: BodyBudget,
        announced: int | None,
        receive_now: ReceiveNow | None = None,
    ) -> None:
        self._receive = receive
        self._receive_now = receive_now
        self.max_bytes = server.max_body_bytes
        self.timeout_s = server.body_timeout_s
        self.budget = budget
        #: the Content-Length, or None for a chunked body
        self.announced = announced
        self.state = BodyState.HELD
        self.reserved = 0
        self._settled = trio.Event()
        self._ended_for_app = False
        #: the app's disconnect callback, held until the body is settled
        self._on_gone: Callable[[], None] | None = None

    # -- the handler's side ----------------------------------------------------------------

    async def read(self) -> bytearray:
        """The whole body, or 413 request_too_large, 408 request_body_timeout, 503."""
        if self.state is not BodyState.HELD:
            raise RuntimeError(f"the body was already taken ({self.state.value})")
        if self.announced is not None and self.announced > self.max_bytes:
            self._settle(BodyState.BROKEN)  # not read: its answer closes the connection
            raise self._too_large()
        await self._reserve(_share(self.announced or 0))  # still held: a refusal discards it
        self.state = BodyState.READING
        body = bytearray()
        reader = _Reader(self)
        while (chunk := await reader.next_chunk()) is not None:
            if len(body) + len(chunk) > self.max_bytes:
                self._settle(BodyState.BROKEN)
                raise self._too_large()
            more = _share(len(body) + len(chunk)) - self.reserved
            if more > 0:  # a chunked body reserves as it grows
                try:
                    await self._reserve(more)
                except GatewayError:
                    self._settle(BodyState.BROKEN)
                    raise
            body += chunk
        self._settle(BodyState.READ)
        return body

    async def discard(self) -> bool:
        """Read what is left of the body and drop it; False when the connection must
        close instead (the body too large, too slow or cut off).

        Large bodies (over ``SMALL_BODY``, or of unknown length) are dropped at most
        ``DISCARDS`` at a time, each waiting up to ``body_timeout_s`` for its turn (else
        the connection closes): reading what nobody will use is the work an
        unauthenticated flood asks of the server, and it must not crowd out the rest.
        """
        if self.state is not BodyState.HELD:
            return self.state is not BodyState.BROKEN
        if self.announced is not None and self.announced > self.max_bytes:
            self._settle(BodyState.BROKEN)
            return False
        if self.announced is not None and self.announced <= SMALL_BODY:
            return await self._drop()
        with trio.move_on_after(self.timeout_s):
            async with self.budget.discarding:
                return await self._drop()
        self._settle(BodyState.BROKEN)
        return False

    async def _drop(self) -> bool:
        self.state = BodyState.READING
        size = 0
        reader = _Reader(self)
        try:
            while (chunk := await reader.next_chunk()) is not None:
                size += len(chunk)
                if size > self.max_bytes:
                    self._settle(BodyState.BROKEN)
                    return False
        except GatewayError:
            return False  # too slow or cut off: settled as broken
        self._settle(BodyState.DISCARDED)
        return True

    def release(self) -> None:
        """The request is over: its share of the budget goes back."""
        self.budget.give(self.reserved)
        self.reserved = 0

    async def _reserve(self, size: int) -> None:
        """Room in the budget, waited for (the body unread) up to ``body_timeout_s``."""
        if not await self.budget.take(size, trio.current_time() + self.timeout_s):
            raise GatewayError(
                "service_unavailable", "The server is busy reading other request bodies."
            )
        self.reserved += size

    def _too_large(self) -> GatewayError:
        return GatewayError(
            "request_too_large",
            f"The request body is larger than {self.max_bytes} bytes.",
            headers={"Connection": "close"},
        )

    def _settle(self, state: BodyState) -> None:
        self.state = state
        self._settled.set()
        on_gone, self._on_gone = self._on_gone, None
        if on_gone is not None:
            on_gone()

    # -- the framework's side --------------------------------------------------------------

    def watch(self, server_watch: Watch) -> Watch:
        """The app's :data:`~gateway.edge.asgi.Watch`: as :meth:`app_receive` hands over
        the disconnect, it tells of a client gone only once the body is settled (a
        client that leaves mid-body is the reader's to see: the body is cut off)."""

        def watch(callback: Callable[[], None]) -> None:
            def gone() -> None:
                if self._settled.is_set():
                    callback()
                else:
                    self._on_gone = callback

            server_watch(gone)

        return watch

    async def app_receive(self) -> Message:
        """What Quart's receiving task sees: nothing until the body is settled, then an
        empty end of body (the bytes went to the handler or nowhere), then only the
        disconnect."""
        if not self._ended_for_app:
            await self._settled.wait()
            self._ended_for_app = True
            return {"type": "http.request", "body": b"", "more_body": False}
        while True:
            message = await self._receive()
            if message["type"] != "http.request":
                return message


def announced_length(scope: Scope) -> int | None:
    """The Content-Length of a request; 0 when it has no body, None for a chunked one."""
    length = 0
    for name, value in scope.get("headers", ()):
        if name.lower() == b"transfer-encoding":
            return None
        if name.lower() == b"content-length":
            length = int(value)  # h11 has checked it is a number
    return length


class _Reader:
    """A body's chunks as they arrive, under the deadline and the minimum rate."""

    def __init__(self, gate: BodyGate) -> None:
        self.gate = gate
        self.start = trio.current_time()
        self.received = 0
        self.ended = False

    async def next_chunk(self) -> bytes | None:
        """The next non-empty chunk; None at the end of the body."""
        gate = self.gate
        while not self.ended:
            allowance = min(gate.timeout_s, MIN_RATE_GRACE_S + self.received / MIN_RATE)
            # arrived already: no deadline to wait under
            message = gate._receive_now() if gate._receive_now is not None else None
            if message is None:
                with trio.move_on_at(self.start + allowance):
                    message = await gate._receive()
            if message is None:
                gate._settle(BodyState.BROKEN)
                raise GatewayError(
                    "request_body_timeout",
                    "The request body did not arrive in time.",
                    headers={"Connection": "close"},
                )
            if message["type"] != "http.request":  # the client went away
                gate._settle(BodyState.BROKEN)
                raise GatewayError("invalid_request", "The request body was cut off.")
            self.ended = not message.get("more_body", False)
            chunk: bytes = message.get("body", b"")
            if chunk:
                self.received += len(chunk)
                return chunk
        return None


class BodyGateMiddleware:
    """Wraps the app's ASGI callable: a :class:`BodyGate` for every request with a body."""

    def __init__(self, app: App, server: ServerConfig) -> None:
        self.app = app
        self.server = server
        self.budget = BodyBudget(server.max_buffered_body_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        announced = announced_length(scope) if scope["type"] == "http" else 0
        if announced == 0:
            await self.app(scope, receive, send)
            return
        gate = BodyGate(receive, self.server, self.budget, announced, receive_now(scope))
        scope[SCOPE_KEY] = gate
        server_watch = disconnect_watch(scope)
        if server_watch is not None:
            set_disconnect_watch(scope, gate.watch(server_watch))
        try:
            await self.app(scope, gate.app_receive, send)
        finally:
            gate.release()


def gate_of(request: Request) -> BodyGate | None:
    """The request's body gate; None when it announced no body."""
    found = request.scope.get(SCOPE_KEY)
    return found if isinstance(found, BodyGate) else None
