"""Open client connections: a cap on them, and the descriptor limit it must fit in.

Why: every connection holds a file descriptor, and hypercorn accepts without bound. A
thousand clients that trickle their requests exhausted the process's descriptors
(EMFILE), and then every endpoint, the catalog included, timed out. Here:

- :class:`CappedListener` accepts a connection only while fewer than ``[server]
  max_connections`` are open (hypercorn's worker serves over it:
  :func:`gateway.serving.patches.hypercorn_worker.serve_http`). Past the cap the next
  ``accept`` waits: the kernel's listen backlog holds the new client until a connection
  closes, and the process never runs out of descriptors.
- Fairness (:class:`ClientConnections`): one client address holds at most ``[server]
  max_connections_per_client`` of them (half the cap by default): a connection past it
  is closed as soon as accepted. And near the cap (fewer than :data:`HEADROOM` of its
  places free), each accept first closes the connection whose request has been
  incomplete the longest (a trickled head or body, for at least
  :data:`MIN_INCOMPLETE_S`): the slowest requests go first, not the clients waiting in
  the backlog. A connection between requests, or whose request is complete (its answer
  in progress, a stream included), is never cut for room. Before, a thousand trickling
  connections from one address held every place, and everyone else waited seconds
  (issue 50).
- ``serve`` raises the soft descriptor limit to the hard one at start
  (:func:`raise_descriptor_limit`) and, when even that cannot hold the cap beside the
  upstream connection pools and the server's own files, :func:`fit_descriptor_limit`
  shrinks the cap and the pools alike (with a warning), or refuses the start when too
  few client connections would be left.
"""

from __future__ import annotations

import logging
import resource
import socket
import sys
import time
from contextlib import suppress
from dataclasses import replace

import trio

from gateway.config.settings import Config, ServerConfig
from gateway.observe.logs import event
from gateway.serving.patches import trio_socket

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
#: near the cap: fewer free places than this share of it
HEADROOM = 0.05
#: a request incomplete for less than this is never cut for room (a normal client's
#: head and body arrive within milliseconds)
MIN_INCOMPLETE_S = 1.0
#: while no place is free: how often room is made again
ROOM_CHECK_S = 0.25


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


class CountedStream(trio.abc.HalfCloseableStream):
    """A client connection that gives its place back when closed (once).

    Its sends are serialised, EOF included: hypercorn sends answers under a lock but
    half-closes without it (``TCPServer._close``), from the reading task, when a client
    keeps sending after an answer that closes the connection (a refused trickling body);
    the answer's last send then failed with BusyResourceError, logged as an error of the
    app. hypercorn reads the addresses from ``socket`` and, finding no ``do_handshake``,
    serves it as plain HTTP (``TCPServer.run``; both reviewed in
    :mod:`gateway.serving.patches.hypercorn_worker`).
    """

    def __init__(
        self,
        stream: trio.SocketStream,
        connections: ClientConnections,
        address: str,
        place: object,
    ) -> None:
        self.stream = stream
        self.socket = stream.socket  # hypercorn reads the peer and local addresses
        self._raw = trio_socket.raw_socket(stream)
        self._connections: ClientConnections | None = connections
        self.address = address
        #: the borrower of its place under the cap
        self.place = place
        #: the request's progress: between requests, incomplete, complete (answering)
        self.phase = IDLE
        self._sending = trio.Lock()
        self._eof_sent = False
        self._receiving = False
        self._client_closed = trio.Event()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await acquire(self._sending)
        try:
            if self._raw is not None:
                await trio_socket.send_all(self.stream, self._raw, data)
            else:
                await self.stream.send_all(data)
        finally:
            self._sending.release()

    def send_now(self, data: bytes) -> bytes | memoryview:
        """What of ``data`` the kernel did not take at once (empty: all of it went), for
        :meth:`send_all` to send; no wait, no scheduler pass. Nothing goes while another
        send waits for room (its bytes come first)."""
        if self._raw is None or self._sending.locked():
            return data
        return memoryview(data)[trio_socket.send_now(self.stream, self._raw, data) :]

    def abort(self) -> None:
        """Close the socket now, a write cut part-way (nothing more can follow it); a
        task waiting on it is woken with ``ClosedResourceError``, and the place goes
        back at :meth:`aclose`, as for any connection."""
        self.stream.socket.close()

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        self._receiving = True
        try:
            if self._raw is not None:
                data = await trio_socket.receive_some(self._raw, max_bytes)
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
                if self._connections is not None:
                    self._connections.leave(self)
                    self._connections = None

    def request_bytes(self) -> None:
        """Bytes of a request arrived: between requests, a request begins, incomplete."""
        if self.phase is IDLE and self._connections is not None:
            self.phase = INCOMPLETE
            self._connections.incomplete[self] = time.monotonic()

    def request_complete(self) -> None:
        """The request's body arrived whole: its answer is the server's to give."""
        self._settled(COMPLETE)

    def request_done(self) -> None:
        """The answer is sent: the connection waits for its next request."""
        self._settled(IDLE)

    def _settled(self, phase: str) -> None:
        if self.phase is INCOMPLETE and self._connections is not None:
            self._connections.incomplete.pop(self, None)
        self.phase = phase

    def cut(self) -> None:
        """Close the connection for room: its reading task sees the end and closes it."""
        with suppress(OSError):
            self.socket.shutdown(socket.SHUT_RDWR)

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


async def acquire(lock: trio.Lock) -> None:
    """Take ``lock``: at once when it is free (``async with`` always passes through the
    scheduler), else wait for it. A send that follows passes through the scheduler only
    when it must wait (:mod:`gateway.serving.patches.trio_socket`); the task's next receive
    always does."""
    if lock.locked():
        await lock.acquire()
    else:
        lock.acquire_nowait()


IDLE, INCOMPLETE, COMPLETE = "idle", "incomplete", "complete"


def per_client_limit(server: ServerConfig) -> int:
    """``[server] max_connections_per_client``, or half of ``max_connections``."""
    return server.max_connections_per_client or max(1, server.max_connections // 2)


class ClientConnections:
    """The open client connections of one server: their places under the cap, their
    count per client address, and which requests are incomplete since when."""

    def __init__(self, cap: int, per_client: int) -> None:
        self.limiter = trio.CapacityLimiter(cap)
        self.per_client = per_client
        self.headroom = max(1, int(cap * HEADROOM))
        self.by_address: dict[str, int] = {}
        #: connection → since when its request is incomplete; insertion order is that
        #: order (a connection leaves and enters again at the end)
        self.incomplete: dict[CountedStream, float] = {}

    def admit(self, address: str) -> bool:
        """One more connection of ``address``, unless it holds its limit already."""
        held = self.by_address.get(address, 0)
        if held >= self.per_client:
            return False
        self.by_address[address] = held + 1
        return True

    def leave(self, stream: CountedStream) -> None:
        self.incomplete.pop(stream, None)
        held = self.by_address[stream.address] - 1
        if held:
            self.by_address[stream.address] = held
        else:
            del self.by_address[stream.address]
        self.limiter.release_on_behalf_of(stream.place)

    def make_room(self) -> None:
        """Near the cap: cut the connection whose request is incomplete the longest."""
        if self.limiter.available_tokens >= self.headroom or not self.incomplete:
            return
        oldest, since = next(iter(self.incomplete.items()))
        if time.monotonic() - since >= MIN_INCOMPLETE_S:
            del self.incomplete[oldest]  # cut once
            oldest.cut()


class CappedListener(trio.abc.Listener[trio.abc.HalfCloseableStream]):
    """Accepts only while ``connections`` has a place for one more connection (making
    room near the cap), closes at once one past its address's limit, and accepts
    nothing before ``opened`` is set (when given: a worker of several accepts once
    ready)."""

    def __init__(
        self,
        listener: trio.SocketListener,
        connections: ClientConnections,
        opened: trio.Event | None = None,
    ) -> None:
        self.listener = listener
        self.connections = connections
        self.opened = opened

    async def accept(self) -> trio.abc.HalfCloseableStream:
        if self.opened is not None:
            await self.opened.wait()
        connections = self.connections
        while True:
            place = object()
            await self._place(place)
            try:
                stream = await self.listener.accept()
                address = str(stream.socket.getpeername()[0])
            except BaseException:
                connections.limiter.release_on_behalf_of(place)
                raise
            if connections.admit(address):
                return CountedStream(stream, connections, address, place)
            connections.limiter.release_on_behalf_of(place)
            stream.socket.close()  # past its address's limit: closed unread

    async def _place(self, place: object) -> None:
        """A place for ``place`` under the cap; while there is none, room is made every
        :data:`ROOM_CHECK_S` (an incomplete request comes of age while we wait)."""
        connections = self.connections
        while True:
            connections.make_room()
            with trio.move_on_after(ROOM_CHECK_S) as waiting:
                await connections.limiter.acquire_on_behalf_of(place)
            if not waiting.cancelled_caught:
                return

    async def aclose(self) -> None:
        await self.listener.aclose()
