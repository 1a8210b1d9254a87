"""A lean pooled HTTP/1.1 client: the one kind of request an OpenAI-compatible upstream gets.

Why not httpx: on the hot path its layers (client, transport, httpcore's pool and
connection, h11's event machinery) were about a quarter of the gateway's CPU per call and
a third of its cost per relayed stream chunk (bench/RESULTS.md). This client does only
what the gateway asks of an upstream: a ``POST`` of a JSON body on a kept-alive
connection (plain TCP or TLS), the status and headers of the answer, then its body whole
or piece by piece as it arrives (``Content-Length``, chunked, or until the connection
closes). No redirects, cookies or compression (the gateway asks for none). A proxy named
by ``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``ALL_PROXY`` (minus ``NO_PROXY`` and loopback hosts)
is used as httpx used it: a ``CONNECT`` tunnel for ``https``, the absolute URL for ``http``.

Failures are three exceptions, which the provider maps to its own error tree:

    Unreachable   the connection or TLS handshake failed, or the request could not be sent
    Lost          the connection closed, reset, or broke the protocol after the request went
    TimedOut      no byte of the answer within the read timeout (per read, as httpx's was)

Pooling: at most ``max_connections`` requests at once (a request waits for a slot up to
the timeout, then ``Unreachable``), idle connections kept and reused last-in first-out. A
connection goes back to the pool only once its answer was read to the end and neither
side asked to close it; an idle one the upstream closed (its socket turned readable) is
dropped when next taken.

Parsing: ``h11`` reads each answer's head (status line, headers, interim answers; a
``Content-Length`` of digits only, a ``Transfer-Encoding`` of ``chunked`` only). An answer
h11 refuses is ``Lost``, and so is one with both ``Transfer-Encoding`` and
``Content-Length`` (RFC 9112 lets the first win; two framings are a response-smuggling
shape). The body is read here in the framing h11 validated: a byte count, chunks (size
lines as strict as h11's, the CRLF after each checked), or up to the connection's end.
h11 reading the body as well cost about a tenth more of the gateway's CPU per relayed
chunk (an event per chunk), and writing the request through it ~35 µs more per call
(bench/RESULTS.md): so the request's head is written here, and h11, a new one per
answer, is told of a ``POST`` (all that the answer's framing depends on).
"""

from __future__ import annotations

import base64
import ipaddress
import re
import ssl
import urllib.request
from collections.abc import AsyncGenerator
from contextlib import aclosing
from contextvars import ContextVar
from typing import NamedTuple, Protocol
from urllib.parse import unquote, urlsplit

import h11
import trio

from gateway.serving.patches import trio_socket as socket_io

#: the most bytes of a status line and headers
MAX_HEAD = 64 * 1024
READ_SIZE = 65536
#: reads in a row that find their bytes already there before one scheduler pass
UNYIELDED_READS = 8


class BeforeWait(Protocol):
    """What a task does before its read waits for the upstream (:data:`BEFORE_WAIT`)."""

    #: set by every read: this task's reads call :meth:`before_upstream_wait` (a task
    #: whose reads come through another client never learns when they wait)
    hooked: bool

    async def before_upstream_wait(self) -> None:
        """Raises nothing but a cancellation: it runs inside the client's read."""


#: set by a task that reads an upstream's answer piece by piece and has work to do
#: whenever a read finds nothing there yet: a stream's pump writes what the reads so far
#: gave it (``gateway/calls/streaming.py``), so that the chunks of one upstream burst go
#: to the client in one write, and none waits for the next burst
BEFORE_WAIT: ContextVar[BeforeWait | None] = ContextVar("svc_before_upstream_wait", default=None)
_FORBIDDEN = frozenset("\r\n\0")
#: a chunk's size line (RFC 9112 7.1, as h11 reads it): hex digits, then any extensions
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,16})(?:;[^\r\n]*)?[ \t]*")
#: what h11 is told each request was, to read its answer: a ``POST`` (not a ``HEAD`` or a
#: ``CONNECT``, whose answers are framed otherwise); its target and host play no part
_POST = h11.Request(method="POST", target="/", headers=[("Host", "upstream")])


class HTTPFailure(Exception):
    """The request failed below HTTP; the subclass says when."""


class Unreachable(HTTPFailure):
    """No connection, or the request could not be sent."""


class Lost(HTTPFailure):
    """The connection failed after the request was sent."""


class TimedOut(HTTPFailure):
    """The upstream sent nothing within the read timeout."""


class Proxy(NamedTuple):
    host: str
    port: int
    #: the Proxy-Authorization value of the proxy URL's user and password, if any
    authorization: str | None


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bypassed(host: str, proxies: dict[str, str]) -> bool:
    """Whether ``NO_PROXY`` names ``host`` (the standard library's own rule)."""
    bypass = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]  # public since Python 3.0, missing from typeshed's stub
    return bool(bypass(host, proxies))


def proxy_for(scheme: str, host: str) -> Proxy | None:
    """The proxy the environment names for ``scheme://host``: None for loopback hosts
    (no proxy can reach them) and hosts that ``NO_PROXY`` lists."""
    proxies = urllib.request.getproxies_environment()
    url = proxies.get(scheme) or proxies.get("all")
    if not url or _is_loopback(host) or _bypassed(host, proxies):
        return None
    parts = urlsplit(url if "://" in url else f"http://{url}")
    authorization = None
    if parts.username is not None:
        credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        authorization = "Basic " + base64.b64encode(credentials.encode()).decode("ascii")
    return Proxy(parts.hostname or "", parts.port or 80, authorization)


class Connection:
    """One kept-alive connection and the bytes read from it but not yet consumed."""

    __slots__ = ("buffer", "raw", "reusable", "stream", "unyielded")

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        #: the plain socket under a plain-HTTP stream (its cheaper sends and receives)
        self.raw = socket_io.raw_socket(stream)
        self.buffer = bytearray()
        self.reusable = True
        #: reads in a row that found their bytes there, with no scheduler pass since
        self.unyielded = 0

    def idle_and_open(self) -> bool:
        """False when the upstream closed it (or sent something) while it was idle."""
        if self.raw is not None:
            return socket_io.idle_and_open(self.raw)
        stream = self.stream
        if isinstance(stream, trio.SSLStream):
            stream = stream.transport_stream
        assert isinstance(stream, trio.SocketStream)
        return not stream.socket.is_readable()

    async def fill(self, timeout: float) -> bool:
        """Read more into the buffer; False at the end of the connection."""
        data = await self.receive(timeout)
        self.buffer += data
        return bool(data)

    async def receive(self, timeout: float) -> bytes:
        """The next bytes from the upstream; empty at the end of the connection."""
        before = BEFORE_WAIT.get()
        if before is not None:
            before.hooked = True
        try:
            # bytes already there need no timeout's scope (it costs ~50 calls); nor a
            # scheduler pass each: a stream's reader that passed after every read let
            # the answer's task send what one read held, often a chunk or two, and at
            # full speed the sends per chunk were the larger part of a chunk's CPU. A
            # pass every UNYIELDED_READS reads still lets the others run (and a
            # cancellation in) while an upstream sends faster than it is read.
            data = socket_io.receive_now(self.raw, READ_SIZE) if self.raw is not None else None
            if data is not None:
                self.unyielded += 1
                if self.unyielded >= UNYIELDED_READS:
                    self.unyielded = 0
                    await trio.lowlevel.checkpoint()
            else:
                self.unyielded = 0
                if before is not None:
                    await before.before_upstream_wait()
                deadline = trio.current_time() + timeout
                if trio.current_effective_deadline() <= deadline:
                    # a nearer deadline (the call's) ends the wait first: the read
                    # timeout's own scope could never fire
                    data = await self._receive_waiting()
                else:
                    with trio.move_on_at(deadline) as scope:
                        data = await self._receive_waiting()
                    if scope.cancelled_caught:
                        raise TimedOut("no data within the read timeout")
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise Lost(type(exc).__name__) from None
        if not data:
            self.reusable = False
            return b""
        return data

    async def _receive_waiting(self) -> bytes:
        if self.raw is not None:
            return await socket_io.receive_waiting(self.raw, READ_SIZE)
        return bytes(await self.stream.receive_some(READ_SIZE))  # bytes: no copy

    def send_now(self, data: bytes) -> bytes | memoryview:
        """What of ``data`` the kernel did not take at once (empty: all went), for
        :meth:`send_all`: the write timeout's scope is needed only for that."""
        if self.raw is None:
            return data
        assert isinstance(self.stream, trio.SocketStream)
        return memoryview(data)[socket_io.send_now(self.stream, self.raw, data) :]

    async def send_all(self, data: bytes | memoryview) -> None:
        if self.raw is not None:
            assert isinstance(self.stream, trio.SocketStream)
            await socket_io.send_all(self.stream, self.raw, data)
        else:
            await self.stream.send_all(data)

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await trio.aclose_forcefully(self.stream)


class Response:
    """An answer whose status and headers were read; its body is read by :meth:`read`
    or :meth:`iter_body`, and :meth:`aclose` returns the connection (or closes it)."""

    __slots__ = ("_chunked", "_conn", "_done", "_left", "_pool", "headers", "status")

    def __init__(self, pool: HTTP1Pool, conn: Connection, head: h11.Response) -> None:
        self.status = status = head.status_code
        headers: dict[bytes, bytes] = {}
        for raw_name, value in head.headers.raw_items():
            name = raw_name.lower()
            headers[name] = headers[name] + b", " + value if name in headers else value
        self.headers = headers
        # h11 checked both: Transfer-Encoding is "chunked", Content-Length one number
        self._chunked = b"transfer-encoding" in headers
        length = headers.get(b"content-length")
        if self._chunked and length is not None:
            conn.reusable = False
            raise Lost("an answer with both Transfer-Encoding and Content-Length")
        connection = headers.get(b"connection", b"").lower()
        if b"close" in connection or (
            head.http_version == b"1.0" and b"keep-alive" not in connection
        ):
            conn.reusable = False
        self._pool = pool
        self._conn: Connection | None = conn
        #: bytes of a Content-Length body left to read (None: chunked or until close)
        self._left: int | None = None
        if status in (204, 304):
            self._left = 0
        elif length is not None:
            self._left = int(length)
        elif not self._chunked:
            conn.reusable = False  # the body ends when the connection does
        self._done = False

    async def read(self) -> bytes:
        """The whole body."""
        parts = [piece async for piece in self.iter_body()]
        return b"".join(parts)

    async def iter_body(self) -> AsyncGenerator[bytes, None]:
        """The body as it arrives: every complete piece read so far, at each read."""
        conn = self._conn
        assert conn is not None
        timeout = self._pool.timeout
        if self._chunked:
            # closed with this generator when a reader leaves early (else GC'd unfinished)
            async with aclosing(self._iter_chunked(conn, timeout)) as chunks:
                async for piece in chunks:
                    yield piece
        elif self._left is not None:
            while self._left:
                if not conn.buffer and not await conn.fill(timeout):
                    raise Lost("the connection closed before the body's end")
                piece = bytes(conn.buffer[: self._left])
                del conn.buffer[: len(piece)]
                self._left -= len(piece)
                yield piece
        else:
            while True:
                if conn.buffer:
                    piece = bytes(conn.buffer)
                    conn.buffer.clear()
                    yield piece
                if not await conn.fill(timeout):
                    break
        self._done = True

    async def _iter_chunked(self, conn: Connection, timeout: float) -> AsyncGenerator[bytes, None]:
        buffer = conn.buffer
        while True:
            pieces: list[bytes] = []
            #: where the unparsed part of the buffer starts: the parsed chunks are cut
            #: off the buffer once a read, not each (a read holds dozens of small ones)
            at = 0
            while True:
                line_end = buffer.find(b"\r\n", at)
                if line_end < 0:
                    break
                size_line = _CHUNK_SIZE.fullmatch(buffer, at, line_end)
                if size_line is None:
                    conn.reusable = False
                    raise Lost("invalid chunk size")
                size = int(size_line[1], 16)
                if size == 0:
                    # the last chunk: skip any trailers, up to the empty line
                    end = buffer.find(b"\r\n\r\n", line_end)
                    if end < 0:
                        break
                    del buffer[: end + 4]
                    if pieces:
                        yield b"".join(pieces)
                    return
                start = line_end + 2
                end = start + size
                if len(buffer) < end + 2:
                    break
                if buffer[end : end + 2] != b"\r\n":
                    conn.reusable = False
                    raise Lost("a chunk longer than its size")
                pieces.append(bytes(buffer[start:end]))
                at = end + 2
            del buffer[:at]
            if pieces:
                yield b"".join(pieces) if len(pieces) > 1 else pieces[0]
            if len(buffer) > MAX_HEAD and buffer.find(b"\r\n") < 0:
                conn.reusable = False
                raise Lost("invalid chunk size line")
            if not await conn.fill(timeout):
                raise Lost("the connection closed before the body's end")

    async def aclose(self) -> None:
        """Give the connection back when the whole body was read, else close it."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        await self._pool.release(conn, reuse=self._done and conn.reusable and not conn.buffer)


class HTTP1Pool:
    """Connections to one origin (``base_url``'s scheme, host and port)."""

    def __init__(
        self, base_url: str, *, max_connections: int, timeout: float, connect_timeout: float
    ) -> None:
        parts = urlsplit(base_url)
        self.tls = parts.scheme == "https"
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if self.tls else 80)
        default_port = (parts.port is None) or parts.port == (443 if self.tls else 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if default_port else f"{host}:{self.port}"
        self.authority = f"{host}:{self.port}"
        self.proxy = proxy_for(parts.scheme, self.host)
        #: what every request's path extends: base_url's path, or for plain HTTP through a
        #: proxy, its absolute URL
        self.prefix = parts.path.rstrip("/")
        #: lines every request's head carries besides its own headers
        self._fixed = f"Host: {self.host_header}\r\n"
        if self.proxy is not None and not self.tls:
            self.prefix = f"http://{self.host_header}{self.prefix}"
            if self.proxy.authorization:
                self._fixed += f"Proxy-Authorization: {self.proxy.authorization}\r\n"
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._slots = trio.Semaphore(max_connections)
        self._idle: list[Connection] = []
        self._ssl: ssl.SSLContext | None = None
        self._closed = False

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            context = ssl.create_default_context()
            context.set_alpn_protocols(["http/1.1"])
            self._ssl = context
        return self._ssl

    async def _connect(self) -> Connection:
        try:
            with trio.fail_after(self.connect_timeout):
                if self.proxy is None:
                    stream: trio.abc.Stream = await trio.open_tcp_stream(self.host, self.port)
                else:
                    stream = await trio.open_tcp_stream(self.proxy.host, self.proxy.port)
                    if self.tls:
                        await self._tunnel(stream)
                if self.tls:
                    tls = trio.SSLStream(
                        stream,
                        self._ssl_context(),
                        server_hostname=self.host,
                        https_compatible=True,
                    )
                    try:
                        await tls.do_handshake()
                    except BaseException:
                        await trio.aclose_forcefully(stream)
                        raise
                    stream = tls
        except trio.TooSlowError:
            raise Unreachable("ConnectTimeout") from None
        except (OSError, trio.BrokenResourceError, ssl.SSLError) as exc:
            raise Unreachable(type(exc).__name__) from None
        return Connection(stream)

    async def _tunnel(self, stream: trio.abc.Stream) -> None:
        """Ask the proxy for a tunnel to the upstream (``CONNECT``); TLS goes through it."""
        assert self.proxy is not None
        headers = [("Host", self.authority)]
        if self.proxy.authorization:
            headers.append(("Proxy-Authorization", self.proxy.authorization))
        conn = Connection(stream)
        status = 0
        try:
            connect = h11.Request(method="CONNECT", target=self.authority, headers=headers)
            parser, request = _told(connect)
            await stream.send_all(request)
            status = (await _read_head(conn, parser, self.connect_timeout)).status_code
        except (HTTPFailure, h11.LocalProtocolError, UnicodeEncodeError):
            pass  # no answer (or a host name h11 cannot send)
        if not 200 <= status < 300 or conn.buffer:
            await trio.aclose_forcefully(stream)
            raise Unreachable(f"ProxyError: CONNECT answered {status}")

    async def _take(self) -> Connection:
        while self._idle:
            conn = self._idle.pop()
            if conn.idle_and_open():
                return conn
            await conn.aclose()
        return await self._connect()

    async def release(self, conn: Connection, *, reuse: bool) -> None:
        self._slots.release()
        if reuse and not self._closed:
            self._idle.append(conn)
        else:
            await conn.aclose()

    async def post(self, path: str, headers: dict[str, str], body: bytes) -> Response:
        """Send ``POST prefix+path`` with ``body``; the answer once its head is read.

        The caller must :meth:`Response.aclose` it (a ``finally``), whatever happens.
        """
        head = [
            f"POST {self.prefix}{path} HTTP/1.1\r\n{self._fixed}Content-Length: {len(body)}\r\n"
        ]
        for name, value in headers.items():
            if not _FORBIDDEN.isdisjoint(value):
                raise Unreachable("a header value holds a line break")
            head.append(f"{name}: {value}\r\n")
        head.append("\r\n")
        try:
            request = "".join(head).encode("ascii")
        except UnicodeEncodeError:
            raise Unreachable("a header value is not ASCII") from None
        if self._slots.value:
            self._slots.acquire_nowait()
        else:
            with trio.move_on_after(self.timeout) as waited:
                await self._slots.acquire()
            if waited.cancelled_caught:
                raise Unreachable("PoolTimeout")
        conn: Connection | None = None
        try:
            conn = await self._take()
            try:
                rest = conn.send_now(request + body)
                if rest:
                    with trio.move_on_after(self.timeout) as scope:
                        await conn.send_all(rest)
                    if scope.cancelled_caught:
                        raise Unreachable("WriteTimeout")
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                raise Unreachable(type(exc).__name__) from None
            parser, _ = _told(_POST)
            return Response(self, conn, await _read_head(conn, parser, self.timeout))
        except BaseException:
            if conn is not None:
                conn.reusable = False
                await self.release(conn, reuse=False)
            else:
                self._slots.release()
            raise

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.aclose()


def _told(request: h11.Request) -> tuple[h11.Connection, bytes]:
    """A parser for the answer to ``request``, and the request's head as h11 writes it."""
    parser = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
    return parser, parser.send(request)


async def _read_head(conn: Connection, parser: h11.Connection, timeout: float) -> h11.Response:
    """The head of the next final (non-1xx) answer on ``conn``, read by ``parser`` (told of
    the request); the bytes read after it are left in ``conn.buffer``."""
    while True:
        parser.receive_data(await conn.receive(timeout))
        try:
            event = parser.next_event()
            while type(event) is h11.InformationalResponse:
                event = parser.next_event()
        except h11.RemoteProtocolError:
            if parser.trailing_data[1]:
                raise Lost("the connection closed before an answer") from None
            raise Lost("not an HTTP/1 answer") from None
        if type(event) is not h11.Response:
            continue  # h11.NEED_DATA: the head is not whole yet
        if not event.http_version.startswith(b"1."):
            raise Lost("not an HTTP/1 answer")  # h11 reads any digit.digit
        conn.buffer += parser.trailing_data[0]
        return event
