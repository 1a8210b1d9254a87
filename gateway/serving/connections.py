"""Open client connections: a cap on them, and the descriptor limit it must fit in.

Why: every connection holds a file descriptor, and hypercorn accepts without bound. A
thousand clients that trickle their requests exhausted the process's descriptors
(EMFILE), and then every endpoint, the catalog included, timed out. Here:

- :func:`serve_http` runs hypercorn's trio worker loop (plain HTTP, the only transport
  the gateway serves) over listeners that accept a connection only while fewer than
  ``[server] max_connections`` are open. Past the cap the next ``accept`` waits: the
  kernel's listen backlog holds the new client until a connection closes, and the
  process never runs out of descriptors.
- ``serve`` raises the soft descriptor limit to the hard one at start
  (:func:`raise_descriptor_limit`) and, when even that cannot hold the cap beside the
  upstream connection pools and the server's own files, :func:`fit_descriptor_limit`
  shrinks the cap and the pools alike (with a warning), or refuses the start when too
  few client connections would be left.
"""

from __future__ import annotations

import logging
import math
import resource
import sys
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import replace
from functools import partial
from typing import Any

import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.config import Sockets
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import AppWrapper, ConnectionState
from hypercorn.utils import ShutdownError, raise_shutdown, repr_socket_addr

from gateway.config.settings import Config
from gateway.observe.logs import event
from gateway.serving import socket_io

log = logging.getLogger("gateway.serving.connections")

#: how long a closing connection reads what its client still sends (see _linger)
LINGER_S = 2.0
#: descriptors kept for everything but client and upstream connections: the database
#: and its journal, the lock file, listeners, stdio, webhook deliveries, logs
RESERVED_DESCRIPTORS = 128
#: the fewest client connections ``serve`` starts with when it must shrink the cap to the
#: descriptor limit: under it a few slow clients (long streams, trickled bodies) hold
#: every place and everyone else waits in the listen backlog, an outage that only a
#: warning in the log would explain; the start is refused instead
MIN_CLIENT_CONNECTIONS = 64


class DescriptorLimitError(Exception):
    """The descriptor limit leaves too few client connections beside the upstream pools."""


def raise_descriptor_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return sys.maxsize
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, 1 << 20)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            log.warning("could not raise the descriptor limit from %d to %d", soft, hard)
    return soft


def fit_descriptor_limit(config: Config, limit: int) -> Config:
    """``config`` with ``[server] max_connections`` and the upstream pools (each
    provider's ``max_connections``) sized to the descriptor ``limit``.

    Unchanged when they fit beside ``RESERVED_DESCRIPTORS``. Else the cap and every pool
    shrink by the same factor (a pool to at least 1), with one warning; the runtime must
    be built from the config returned, so that its pools have those sizes. Raises
    :class:`DescriptorLimitError` when the cap would fall under
    ``MIN_CLIENT_CONNECTIONS`` (a cap configured under it is kept only where it fits).
    """
    available = limit - RESERVED_DESCRIPTORS
    wanted = config.server.max_connections
    pooled = [p for p in config.providers if p.kind != "mock"]  # the mock opens no socket
    total = wanted + sum(p.max_connections for p in pooled)
    if total <= available:
        return config
    share = max(available, 0) / total
    sizes = {p.name: max(1, int(p.max_connections * share)) for p in pooled}
    cap = min(wanted, available - sum(sizes.values()))
    pools = ", ".join(f"{p.name} {p.max_connections}" for p in pooled) or "none"
    asked = (
        f"the descriptor limit {limit} (less {RESERVED_DESCRIPTORS} reserved) cannot hold"
        f" [server] max_connections {wanted} beside the upstream pools ([[providers]]"
        f" max_connections: {pools})"
    )
    settings = (
        "raise the limit (ulimit -n, or LimitNOFILE= under systemd) or lower [server]"
        f" max_connections and [[providers]] max_connections to fit in {max(available, 0)}"
        " together"
    )
    if cap < MIN_CLIENT_CONNECTIONS:
        raise DescriptorLimitError(
            f"{asked}: shrunk to fit, it would serve at most {max(cap, 0)} client"
            f" connections, fewer than {MIN_CLIENT_CONNECTIONS}; {settings}"
        )
    log.warning(
        "%s: serving at most %d client connections, with pools %s; %s",
        asked,
        cap,
        ", ".join(f"{name} {size}" for name, size in sizes.items()) or "none",
        settings,
        extra=event("descriptor_limit", limit=limit, max_connections=cap, pools=sizes),
    )
    providers = tuple(
        replace(p, max_connections=sizes[p.name]) if p.name in sizes else p
        for p in config.providers
    )
    server = replace(config.server, max_connections=cap)
    return replace(config, server=server, providers=providers)


class _CountedStream(trio.abc.HalfCloseableStream):
    """A client connection that gives its place back when closed (once).

    Its sends are serialised, EOF included: hypercorn sends answers under a lock but
    half-closes without it, from the reading task, when a client keeps sending after an
    answer that closes the connection (a refused trickling body); the answer's last
    send then failed with BusyResourceError, logged as an error of the app.
    """

    def __init__(self, stream: trio.SocketStream, release: Callable[[], None]) -> None:
        self.stream = stream
        self.socket = stream.socket  # hypercorn reads the peer and local addresses
        self._raw = socket_io.raw_socket(stream)
        self._release: Callable[[], None] | None = release
        self._sending = trio.Lock()
        self._eof_sent = False
        self._receiving = False
        self._client_closed = trio.Event()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await _acquire(self._sending)
        try:
            if self._raw is not None:
                await socket_io.send_all(self.stream, self._raw, data)
            else:
                await self.stream.send_all(data)
        finally:
            self._sending.release()

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        self._receiving = True
        try:
            if self._raw is not None:
                data = await socket_io.receive_some(self._raw, max_bytes)
            else:
                data = await self.stream.receive_some(max_bytes)
        finally:
            self._receiving = False
        if not data:
            self._client_closed.set()
        return data

    async def send_eof(self) -> None:
        async with self._sending:
            await self.stream.send_eof()
            self._eof_sent = True

    async def aclose(self) -> None:
        try:
            if self._eof_sent:
                await self._linger()
        finally:
            try:
                await self.stream.aclose()
            finally:
                if self._release is not None:
                    self._release()
                    self._release = None

    async def _linger(self) -> None:
        """After our FIN, let what the client still sends be read and dropped until it
        closes, for at most ``LINGER_S``: a socket closed with unread bytes answers them
        with a reset, which can destroy the answer the client has not read yet (a 408 or
        401 to a client still sending its body). Hypercorn's reading task, when it still
        reads, drops them itself; else they are read here."""
        with trio.move_on_after(LINGER_S):
            if self._receiving:
                await self._client_closed.wait()
                return
            with suppress(
                trio.BrokenResourceError, trio.BusyResourceError, trio.ClosedResourceError
            ):
                while await self.stream.receive_some(65536):
                    pass


class _IdleTimer:
    """hypercorn's idle timer for one connection, without a task per request.

    hypercorn stops its timer when a request comes in and starts it again (a new task,
    under a lock) when the answer is sent: per request a task spawned, one cancelled and
    two locks taken, a tenth of a call's scheduler passes. Here one task per connection
    waits under a cancel scope whose deadline moves instead. Same rules: an idle
    connection is closed after ``keep_alive_timeout``, or at once when the server is
    stopping (one that is busy then, as soon as its answer is sent).
    """

    def __init__(self, connection: TCPServer) -> None:
        self.connection = connection
        self.idle = False
        self.deadline = math.inf
        self.scope: trio.CancelScope | None = None
        self.running = False
        self.ended = False

    async def restart(self, task_group: Any, action: Callable[[], Awaitable[None]]) -> None:
        """The connection is idle from now on (``action``, hypercorn's own timer task,
        is what this replaces)."""
        if self.ended:
            return
        self.idle = True
        self.deadline = trio.current_time() + self.connection.config.keep_alive_timeout
        if not self.running:
            self.running = True
            task_group._nursery.start_soon(self._watch)
        elif self.scope is not None:
            self.scope.deadline = self.deadline
            if self.connection.context.terminated.is_set():
                self.scope.cancel()

    async def stop(self) -> None:
        """The connection is busy (a request came in)."""
        self.idle = False
        self.deadline = math.inf
        if self.scope is not None:
            self.scope.deadline = math.inf

    def end(self) -> None:
        """The connection is over: the timer task ends too."""
        self.ended = True
        self.idle = False
        if self.scope is not None:
            self.scope.cancel()

    async def _watch(self) -> None:
        terminated = self.connection.context.terminated
        while not self.ended:
            with trio.CancelScope(deadline=self.deadline) as scope:
                self.scope = scope
                if terminated.is_set():
                    await trio.sleep_forever()  # until idle (or the end)
                else:
                    await terminated.wait()
            self.scope = None
            if self.idle and not self.ended:
                # idle past the keep-alive timeout, or the server stops: close it
                with trio.CancelScope(shield=True):
                    await self.connection._initiate_server_close()
                return


class _Connection(TCPServer):
    """hypercorn's connection, ended as soon as the client is gone, with a cheaper idle
    timer (:class:`_IdleTimer`).

    Once its read loop ends (the client closed or reset the connection), hypercorn
    still waits for the connection's idle timer (``keep_alive_timeout``, 30 s) before it
    closes the socket: a client that connects and leaves held a descriptor, and a
    place under the cap, for that long. The timer is ended instead, so the socket is
    closed at once (a request still in progress was already told of the disconnect),
    and an answer that finishes after that does not start it again.
    """

    client_gone = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.idle_task = _IdleTimer(self)  # type: ignore[assignment]

    async def _read_data(self) -> None:
        await super()._read_data()
        self.client_gone = True
        self.idle_task.end()  # type: ignore[attr-defined]

    async def protocol_send(self, event: Event) -> None:
        if isinstance(event, RawData):
            # hypercorn's own, but an empty write (h11's end of a sized body) is no
            # write, and a free lock is taken without a scheduler pass
            if not event.data:
                return
            await _acquire(self.send_lock)
            try:
                try:
                    with trio.CancelScope(shield=True):
                        await self.stream.send_all(event.data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    await self.protocol.handle(Closed())
            finally:
                self.send_lock.release()
            return
        if self.client_gone and isinstance(event, Updated) and event.idle:
            return  # an answer finishing after the client left: no timer to wait for
        await super().protocol_send(event)


async def _acquire(lock: trio.Lock) -> None:
    """Take ``lock``: at once when it is free (``async with`` always passes through the
    scheduler), else wait for it. A send that follows passes through the scheduler only
    when it must wait (:mod:`gateway.serving.socket_io`); the task's next receive always does."""
    if lock.locked():
        await lock.acquire()
    else:
        lock.acquire_nowait()


class CappedListener(trio.abc.Listener[trio.abc.HalfCloseableStream]):
    """Accepts only while the shared limiter has a place for one more connection."""

    def __init__(self, listener: trio.SocketListener, limiter: trio.CapacityLimiter) -> None:
        self.listener = listener
        self.limiter = limiter

    async def accept(self) -> trio.abc.HalfCloseableStream:
        place = object()
        await self.limiter.acquire_on_behalf_of(place)
        try:
            stream = await self.listener.accept()
        except BaseException:
            self.limiter.release_on_behalf_of(place)
            raise
        return _CountedStream(stream, partial(self.limiter.release_on_behalf_of, place))

    async def aclose(self) -> None:
        await self.listener.aclose()


async def serve_http(
    app: AppWrapper,
    config: HyperConfig,
    sockets: Sockets,
    max_connections: int,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]],
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """hypercorn's ``trio.run.worker_serve`` for plain HTTP, over capped listeners.

    Same order: the app's lifespan starts, the listeners serve until
    ``shutdown_trigger`` returns, connections in progress get ``graceful_timeout``, then
    the lifespan ends. Reports the bound URLs through ``task_status``.
    """
    lifespan_state: dict[str, object] = {}
    lifespan = Lifespan(app, config, lifespan_state)
    context = WorkerContext(None)
    limiter = trio.CapacityLimiter(max_connections)
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as server_nursery:
            listeners = [
                CappedListener(trio.SocketListener(trio.socket.from_stdlib_socket(sock)), limiter)
                for sock in sockets.insecure_sockets
            ]
            binds = [
                f"http://{repr_socket_addr(sock.family, sock.getsockname())}"
                for sock in sockets.insecure_sockets
            ]
            for bind in binds:
                await config.log.info(f"Running on {bind} (CTRL + C to quit)")
            task_status.started(binds)
            handler = partial(_Connection, app, config, context, ConnectionState(lifespan_state))
            try:
                async with trio.open_nursery(strict_exception_groups=True) as nursery:
                    nursery.start_soon(raise_shutdown, shutdown_trigger)
                    nursery.start_soon(
                        partial(
                            trio.serve_listeners,
                            handler,
                            listeners,
                            handler_nursery=server_nursery,
                        )
                    )
                    await trio.sleep_forever()
            except BaseExceptionGroup as error:
                _, others = error.split(ShutdownError)
                if others is not None:
                    raise others from None
            finally:
                await context.terminated.set()
                server_nursery.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()
