"""Open client connections: a cap on them, and the descriptor limit it must fit in.

Why: every connection holds a file descriptor, and hypercorn accepts without bound. A
thousand clients that trickle their requests exhausted the process's descriptors
(EMFILE), and then every endpoint, the catalog included, timed out. Here:

- :class:`CappedListener` accepts a connection only while fewer than ``[server]
  max_connections`` are open (hypercorn's worker serves over it:
  :func:`gateway.serving.patches.hypercorn_worker.serve_http`). Past the cap the next
  ``accept`` waits: the kernel's listen backlog holds the new client until a connection
  closes, and the process never runs out of descriptors.
- ``serve`` raises the soft descriptor limit to the hard one at start
  (:func:`raise_descriptor_limit`) and, when even that cannot hold the cap beside the
  upstream connection pools and the server's own files, :func:`fit_descriptor_limit`
  shrinks the cap and the pools alike (with a warning), or refuses the start when too
  few client connections would be left.
"""

from __future__ import annotations

import logging
import resource
import sys
from collections.abc import Callable
from contextlib import suppress
from dataclasses import replace
from functools import partial

import trio

from gateway.config.settings import Config
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

    def __init__(self, stream: trio.SocketStream, release: Callable[[], None]) -> None:
        self.stream = stream
        self.socket = stream.socket  # hypercorn reads the peer and local addresses
        self._raw = trio_socket.raw_socket(stream)
        self._release: Callable[[], None] | None = release
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


async def acquire(lock: trio.Lock) -> None:
    """Take ``lock``: at once when it is free (``async with`` always passes through the
    scheduler), else wait for it. A send that follows passes through the scheduler only
    when it must wait (:mod:`gateway.serving.patches.trio_socket`); the task's next receive
    always does."""
    if lock.locked():
        await lock.acquire()
    else:
        lock.acquire_nowait()


class CappedListener(trio.abc.Listener[trio.abc.HalfCloseableStream]):
    """Accepts only while the shared limiter has a place for one more connection, and
    not before ``opened`` is set (when given: a worker of several accepts once ready)."""

    def __init__(
        self,
        listener: trio.SocketListener,
        limiter: trio.CapacityLimiter,
        opened: trio.Event | None = None,
    ) -> None:
        self.listener = listener
        self.limiter = limiter
        self.opened = opened

    async def accept(self) -> trio.abc.HalfCloseableStream:
        if self.opened is not None:
            await self.opened.wait()
        place = object()
        await self.limiter.acquire_on_behalf_of(place)
        try:
            stream = await self.listener.accept()
        except BaseException:
            self.limiter.release_on_behalf_of(place)
            raise
        return CountedStream(stream, partial(self.limiter.release_on_behalf_of, place))

    async def aclose(self) -> None:
        await self.listener.aclose()
