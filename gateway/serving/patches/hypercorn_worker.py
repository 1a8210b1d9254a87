"""hypercorn's trio worker for plain HTTP, with a cheaper connection.

Patches hypercorn 0.18.0's trio worker:

- :func:`serve_http` is ``hypercorn.trio.run.worker_serve`` for plain HTTP (the only
  transport the gateway serves), over listeners that accept only while fewer than
  ``[server] max_connections`` are open (:class:`gateway.serving.connections.CappedListener`);
- :class:`_Connection` is its ``TCPServer``, ended as soon as the client is gone, its
  empty writes skipped, an answer's head written with the first bytes of its body, its
  requests' messages handed over through an :class:`_Inbox` and their answers sent
  through an :class:`_Answer` (:class:`_TaskGroup`, which runs the app without
  hypercorn's ``ASGIWrapper`` around it);
- :class:`_Answer` writes a streamed answer's middle body messages to the socket itself,
  framed as h11 would frame them (a chunk of ``Transfer-Encoding: chunked``), past
  hypercorn's stream, its protocol and h11's state machine, which a middle chunk does
  not move (about a tenth of a relayed chunk's CPU; bench/RESULTS.md, issue 49);
- :class:`_IdleTimer` stands in for its per-connection ``TrioSingleTask`` idle timer,
  and reaches its ``TaskGroup``'s private ``_nursery`` as that timer does;
- :class:`ServerConfig` is its ``Config``, with the headers of every answer built once a
  second.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, cast

import h11
import trio
from h11._writers import ChunkedWriter
from hypercorn.config import Config as HyperConfig
from hypercorn.config import Sockets
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.protocol import ProtocolWrapper
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.protocol.http_stream import ASGIHTTPState, HTTPStream
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.task_group import TaskGroup
from hypercorn.trio.tcp_server import MAX_RECV, TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import (
    AppWrapper,
    ASGIFramework,
    ASGIReceiveEvent,
    ASGISendEvent,
    ConnectionState,
    Scope,
)
from hypercorn.utils import (
    ShutdownError,
    parse_socket_addr,
    raise_shutdown,
    repr_socket_addr,
    wrap_app,
)

from gateway.edge.asgi import BODY_FOLLOWS, Send, set_disconnect_watch, set_receive_now
from gateway.serving.connections import (
    CappedListener,
    ClientConnections,
    CountedStream,
    acquire,
)

#: the upstream code this module was reviewed against (see gateway/serving/patches/):
#: qualified name → (version, SHA-256 of its source)
REVIEWED: dict[str, tuple[str, str]] = {
    # serve_http is its copy for plain HTTP
    "hypercorn.trio.run.worker_serve": (
        "0.18.0",
        "8dc8347a9fc357ca334f8c3e4bcf0368176510a96d434f21a5eb4c9ec4103726",
    ),
    # _Connection's base: its idle_task replaced after __init__
    "hypercorn.trio.tcp_server.TCPServer.__init__": (
        "0.18.0",
        "4c1d42457bc197b22f41b54b7dd6a79e195cdc037f9cc55f50e3e4332ebf6988",
    ),
    # copied by _Connection.run for plain HTTP, with a _TaskGroup
    "hypercorn.trio.tcp_server.TCPServer.run": (
        "0.18.0",
        "fd34b021d1a86c9859514de9472306ea47f4a6763732b26b7a5945278ded0e08",
    ),
    # overridden: the RawData branch copied (its shield replaced: _Connection._write),
    # Updated(idle) skipped once the client left
    "hypercorn.trio.tcp_server.TCPServer.protocol_send": (
        "0.18.0",
        "225856426bff7be02990c0badb90f51f801db14ac5db0f3d0c210cafbeb528ab",
    ),
    # copied by _Connection._read_data (no cancel scope per read without a read timeout);
    # its end marks the client gone and ends the idle timer
    "hypercorn.trio.tcp_server.TCPServer._read_data": (
        "0.18.0",
        "7ca747d922c65cf1fb6bd7ceabe82b0b51bb9de218ce159d7b7e093ec279f728",
    ),
    # the rule _IdleTimer keeps; and the close it calls
    "hypercorn.trio.tcp_server.TCPServer._idle_timeout": (
        "0.18.0",
        "210ce1014d98e1cba3c0e2218c53a1c1a1c361cd86457168cbb9391ebb139d1d",
    ),
    "hypercorn.trio.tcp_server.TCPServer._initiate_server_close": (
        "0.18.0",
        "7c1b548a65adc8b1b1358fdacbc860be3070fe99d5b1bdcfcde4c5c73a9cce03",
    ),
    # half-closes without the send lock: connections.CountedStream serialises its sends
    "hypercorn.trio.tcp_server.TCPServer._close": (
        "0.18.0",
        "bc73c4ae25a1ceec1d535639443b57b3d3dea8b03c5375d58bf9702b8056ee15",
    ),
    # replaced by _IdleTimer (its restart() and stop())
    "hypercorn.trio.worker_context.TrioSingleTask": (
        "0.18.0",
        "aa59316c028b876ad16369d57fcf70a82969bfb76436df033de96541935c7212",
    ),
    # overridden by ServerConfig.response_headers: the same headers, built once a second
    "hypercorn.config.Config.response_headers": (
        "0.18.0",
        "5a637c3d48180e55020523bbe601bbffbaae225baf265cd61f88efbe8171a9ca",
    ),
    # its private _nursery holds _IdleTimer's task; _TaskGroup.spawn_app is its
    # spawn_app with an _Inbox instead of a memory channel and an _Answer around send;
    # _handle is a copy of its private _handle that calls the ASGI app directly
    "hypercorn.trio.task_group._handle": (
        "0.18.0",
        "06081a56a9930825919e01e08ad2b2ffaae5508f065bcfced89cd3082db2192f",
    ),
    "hypercorn.trio.task_group.TaskGroup": (
        "0.18.0",
        "8467a3a16a7e8763079b8727fe73d7d2115d0cb99441984856ff1bfcb4fcfbf2",
    ),
    # what _handle calls: the ASGI app under it is called directly instead
    "hypercorn.app_wrappers.ASGIWrapper": (
        "0.18.0",
        "8670a23eb46059a3790a04b4860a137a3b92f0cdab91988e6c64761872af487c",
    ),
    # _Answer writes a middle body message itself when these would only frame it as a
    # chunk: the stream's body branch (app_send, below: its state and closed flag read),
    # the protocol's Body → h11.Data, h11's send (a Data event moves no state) and its
    # chunked writer
    "hypercorn.protocol.h11.H11Protocol.stream_send": (
        "0.18.0",
        "56a36254a368d71ab24ee76d72783226387f6ce3a82c52840a947b9d905ebf5b",
    ),
    "h11._connection.Connection.send_with_data_passthrough": (
        "0.16.0",
        "e8332d21fb1a2963cd8d9f6e5948ee8bc52f1e33709da88722f4b243dfcc1f20",
    ),
    "h11._writers.ChunkedWriter": (
        "0.16.0",
        "816f6bf8247fe299cabea803020f0e797afe64e59640df2099bab46ae3da6e50",
    ),
    # the head is written at the answer's start (held by _Connection.protocol_send); the
    # final body message is followed by StreamClosed, in the sending task (_Answer); a
    # middle one of a chunked answer is written by _Answer when its state is RESPONSE
    "hypercorn.protocol.http_stream.HTTPStream.app_send": (
        "0.18.0",
        "c806044b997369855904b5496ef44bd2bf273f599e686647500ce507c1b0250b",
    ),
    # the disconnect first (_close_stream), then the next cycle and the idle timer
    "hypercorn.protocol.h11.H11Protocol._maybe_recycle": (
        "0.18.0",
        "3ac53f52bc4e65de7e9b898df5c1c76c9865479e2821ed524acdf426c2075a88",
    ),
}


class ServerConfig(HyperConfig):
    """hypercorn 0.18.0's ``Config``, whose headers of every answer (``date``, ``server``)
    are built once a second instead of once an answer: formatting the date was 2 % of a
    call's CPU, and it changes once a second (``format_date_time`` drops the fraction)."""

    _headers: tuple[int, str, list[tuple[bytes, bytes]]] = (-1, "", [])

    def response_headers(self, protocol: str) -> list[tuple[bytes, bytes]]:
        second = int(time.time())
        cached_second, cached_protocol, headers = self._headers
        if second != cached_second or protocol != cached_protocol:
            headers = super().response_headers(protocol)
            self._headers = (second, protocol, headers)
        return list(headers)


class _IdleTimer:
    """hypercorn 0.18.0's idle timer for one connection, without a task per request.

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
            # hypercorn's TaskGroup has no public spawn for this; TrioSingleTask reaches
            # its _nursery too
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


class _Inbox:
    """The messages of one request from hypercorn 0.18.0 to the app (its body, then the
    disconnect), in place of the memory channel of its ``TaskGroup.spawn_app``.

    The channel took a scheduler pass for each message put (in the connection's reading
    task) and for each taken (in the request's task), and Quart-Trio ran a task per
    request only to wait for the disconnect. Here a message is handed over without a
    pass while there is room (at most ``limit`` wait, as in the channel, so a body the
    app does not read holds the client back), and the app can be told of the disconnect
    by a callback (:meth:`watch`, the scope's ``DISCONNECT_WATCH``) instead.

    With the last body message of an answer, hypercorn (in the sending task) closes the
    request's stream, which puts a disconnect here, and then readies the connection for
    its next request and starts its keep-alive timer. The app would cancel the request
    at that disconnect, half-way through that send: the timer never started and an idle
    kept-alive connection stayed open forever. So once the answer's last body message
    has begun (:attr:`answered`, set by :class:`_Answer`) a disconnect is not a client
    gone and the watch is not called: the request ends by itself. A client that goes
    away mid-answer is still seen at once (its disconnect comes before the final send).
    """

    def __init__(self, limit: int, complete: Callable[[], None]) -> None:
        self.limit = limit
        #: told when the request's body has arrived whole (its last message is put)
        self.complete = complete
        self.messages: deque[ASGIReceiveEvent] = deque()
        self._arrived = trio.lowlevel.ParkingLot()
        self._room = trio.lowlevel.ParkingLot()
        self.gone = False
        #: the answer's last body message has begun: a disconnect is its own end
        self.answered = False
        self._watchers: list[Callable[[], None]] = []

    async def put(self, message: ASGIReceiveEvent) -> None:
        """hypercorn's ``app_put``."""
        if message["type"] == "http.disconnect":
            # never held back for room: nothing follows it
            self.gone = True
            self.messages.append(message)
            self._arrived.unpark_all()
            watchers, self._watchers = self._watchers, []
            if not self.answered:
                for callback in watchers:
                    callback()
            return
        if message["type"] == "http.request" and not message.get("more_body", False):
            self.complete()
        while len(self.messages) >= self.limit:
            await self._room.park()
        self.messages.append(message)
        self._arrived.unpark_all()

    async def receive(self) -> ASGIReceiveEvent:
        """The app's ``receive``."""
        while (message := self.receive_now()) is None:
            await self._arrived.park()
        return message

    def receive_now(self) -> ASGIReceiveEvent | None:
        """The app's :data:`~gateway.edge.asgi.ReceiveNow`."""
        if not self.messages:
            return None
        self._room.unpark()
        return self.messages.popleft()

    def watch(self, callback: Callable[[], None]) -> None:
        if not self.gone:
            self._watchers.append(callback)
        elif not self.answered:
            callback()


class _Answer:
    """The ``send`` the app gets: hypercorn 0.18.0's ``HTTPStream.app_send``, told which
    message is the answer's last body message (:attr:`_Inbox.answered`), and whose head
    may wait for the first body bytes (a start message with ``BODY_FOLLOWS``: the two go
    out in one write). A middle body message of an answer h11 sends chunked is written
    here, as h11's ``ChunkedWriter`` frames it (:meth:`_Connection.write_chunk`)."""

    __slots__ = ("app_send", "connection", "inbox", "stream")

    def __init__(self, app_send: Send, inbox: _Inbox, connection: _Connection) -> None:
        self.app_send = app_send
        self.inbox = inbox
        self.connection = connection
        #: hypercorn's stream of this request (its state: whether an answer started)
        stream = getattr(app_send, "__self__", None)
        self.stream = stream if isinstance(stream, HTTPStream) else None

    async def send(self, message: ASGISendEvent | None) -> None:
        if message is not None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    body = message.get("body", b"")
                    if body and self._chunked():
                        await self.connection.write_chunk(body)
                        return
                else:
                    self.inbox.answered = True
            elif message["type"] == "http.response.start" and message.get(BODY_FOLLOWS):
                self.connection.hold_head = True
        await self.app_send(message)

    def _chunked(self) -> bool:
        """The answer started, its stream is open and h11 sends its body in chunks (an
        HTTP/1.1 client, no ``Content-Length``): what hypercorn and h11 would do with a
        body message is frame it as one chunk."""
        stream = self.stream
        if stream is None or stream.closed or stream.state is not ASGIHTTPState.RESPONSE:
            return False
        protocol = self.connection.protocol.protocol
        if type(protocol) is not H11Protocol:
            return False
        h11_connection = protocol.connection
        return h11_connection.our_state is h11.SEND_BODY and (
            type(h11_connection._writer) is ChunkedWriter
        )


async def _handle(
    app: ASGIFramework,
    config: HyperConfig,
    scope: Scope,
    receive: Callable[[], Awaitable[ASGIReceiveEvent]],
    send: Callable[[ASGISendEvent | None], Awaitable[None]],
) -> None:
    """hypercorn 0.18.0's ``task_group._handle``, calling the ASGI app itself rather than
    through ``ASGIWrapper`` (a layer that only drops two arguments), and sending nothing
    once cancelled. hypercorn's closing ``send(None)`` answers a request that has no
    answer yet with a bare 500; under a cancellation (the connection's or the server's
    end: a node that found itself fenced, a stop past its grace) hypercorn's own send
    never got that far, cut at its lock's checkpoint, but this connection's writes take
    no checkpoint when they need not wait (:meth:`_Connection._write`): so a cancelled
    request sends nothing and its connection closes."""
    try:
        await app(scope, receive, send)
    except trio.Cancelled:
        raise
    except BaseExceptionGroup as error:
        _, other_errors = error.split(trio.Cancelled)
        if other_errors is None:
            raise
        await config.log.exception("Error in ASGI Framework")
    except Exception:
        await config.log.exception("Error in ASGI Framework")
    await send(None)


class _TaskGroup(TaskGroup):
    """hypercorn 0.18.0's ``TaskGroup``, its requests' messages in an :class:`_Inbox`
    that tells the connection's stream when a request has arrived whole, their answers
    through an :class:`_Answer`, the app (``asgi_app``, the one ``AppWrapper`` wraps)
    called by :func:`_handle`."""

    def __init__(self, connection: _Connection, asgi_app: ASGIFramework) -> None:
        super().__init__()
        self.connection = connection
        self.stream = cast(CountedStream, connection.stream)
        self.asgi_app = asgi_app

    async def spawn_app(
        self,
        app: AppWrapper,
        config: HyperConfig,
        scope: Scope,
        send: Callable[[ASGISendEvent | None], Awaitable[None]],
    ) -> Callable[[ASGIReceiveEvent], Awaitable[None]]:
        inbox = _Inbox(config.max_app_queue_size, self.stream.request_complete)
        set_disconnect_watch(scope, inbox.watch)
        set_receive_now(scope, inbox.receive_now)
        answer = _Answer(send, inbox, self.connection)
        assert self._nursery is not None
        self._nursery.start_soon(_handle, self.asgi_app, config, scope, inbox.receive, answer.send)
        return inbox.put


class _Connection(TCPServer):
    """hypercorn 0.18.0's connection, ended as soon as the client is gone, with a cheaper
    idle timer (:class:`_IdleTimer`), an answer's head and first body bytes in one write.

    Once its read loop ends (the client closed or reset the connection), hypercorn
    still waits for the connection's idle timer (``keep_alive_timeout``, 30 s) before it
    closes the socket: a client that connects and leaves held a descriptor, and a
    place under the cap, for that long. The timer is ended instead, so the socket is
    closed at once (a request still in progress was already told of the disconnect),
    and an answer that finishes after that does not start it again.
    """

    client_gone = False
    #: the next write is an answer's head whose body follows at once: held until then
    hold_head = False
    #: a head held, written with the next bytes (or before the next other event)
    held = b""

    def __init__(self, asgi_app: ASGIFramework, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.asgi_app = asgi_app
        self.idle_task = _IdleTimer(self)  # type: ignore[assignment]  # not a TrioSingleTask

    async def run(self) -> None:
        """hypercorn's ``run`` for plain HTTP (a ``connections.CountedStream``, no TLS
        handshake), its requests spawned by a :class:`_TaskGroup`."""
        socket = self.stream.socket
        try:
            client = parse_socket_addr(socket.family, socket.getpeername())
            server = parse_socket_addr(socket.family, socket.getsockname())
            async with _TaskGroup(self, self.asgi_app) as task_group:
                self._task_group = task_group
                self.protocol = ProtocolWrapper(
                    self.app,
                    self.config,
                    self.context,
                    task_group,
                    ConnectionState(self.state),
                    False,
                    client,
                    server,
                    self.protocol_send,
                    "http/1.1",
                )
                await self.protocol.initiate()
                await self.idle_task.restart(self._task_group, self._idle_timeout)
                await self._read_data()
        except OSError:
            pass
        finally:
            await self._close()

    async def _read_data(self) -> None:
        """hypercorn's, without a cancel scope around each read when there is no read
        timeout (the gateway sets none: the idle timer and the body's deadline bound a
        client); then the client is gone and the idle timer ends."""
        timeout = self.config.read_timeout
        while True:
            try:
                if not timeout:
                    data = await self.stream.receive_some(MAX_RECV)
                else:
                    with trio.fail_after(timeout):
                        data = await self.stream.receive_some(MAX_RECV)
            except (trio.ClosedResourceError, trio.BrokenResourceError, trio.TooSlowError):
                break
            if data:
                cast(CountedStream, self.stream).request_bytes()
            await self.protocol.handle(RawData(bytes(data)))
            if data == b"":
                break
        await self.protocol.handle(Closed())
        self.client_gone = True
        self.idle_task.end()  # type: ignore[attr-defined]  # the _IdleTimer of __init__

    async def protocol_send(self, event: Event) -> None:
        if isinstance(event, RawData):
            # hypercorn's own, but an empty write (h11's end of a sized body) is no
            # write, a head whose body follows waits for it (two writes were two system
            # calls and, unless the client reads at once, two packets), and a free lock
            # is taken without a scheduler pass
            data = event.data
            if self.hold_head:
                self.hold_head = False
                self.held = data
                return
            if self.held:
                data, self.held = self.held + data, b""
            if data:
                await self._write(data)
            return
        if self.held:  # the answer ends (or the connection) before a body byte
            data, self.held = self.held, b""
            await self._write(data)
        if isinstance(event, Updated) and event.idle:
            cast(CountedStream, self.stream).request_done()
            if self.client_gone:
                return  # an answer finishing after the client left: no timer to wait for
        await super().protocol_send(event)

    async def write_chunk(self, body: bytes) -> None:
        """``body`` as one chunk of a chunked answer (h11's framing), with a held head."""
        data = b"%x\r\n%s\r\n" % (len(body), body)
        if self.held:
            data, self.held = self.held + data, b""
        await self._write(data)

    async def _write(self, data: bytes) -> None:
        """hypercorn's write of ``data``, whole. hypercorn shields the wait for room:
        a write cancelled part-way would leave the answer's framing broken. Here the
        writer's own scope may end that wait (a stream's pump writes its batches under
        its call's deadline, and a client that reads nothing must not hold the call's
        settlement past it), and a write so cut closes the connection: nothing more can
        be sent on it. Who else is cancelled mid-write is a request whose client left or
        a server past its grace, whose connections close all the same."""
        stream = cast(CountedStream, self.stream)
        await acquire(self.send_lock)
        try:
            try:
                rest = stream.send_now(data)
                if rest:
                    try:
                        await stream.send_all(rest)
                    except trio.Cancelled:
                        stream.abort()
                        raise
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                await self.protocol.handle(Closed())
        finally:
            self.send_lock.release()


async def serve_http(
    app: ASGIFramework,
    config: HyperConfig,
    sockets: Sockets,
    max_connections: int,
    per_client: int,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]],
    opened: trio.Event | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """hypercorn 0.18.0's ``trio.run.worker_serve`` for plain HTTP, over capped listeners
    (``app`` wrapped as its ``trio_worker`` wraps the app it loads) that accept nothing
    before ``opened`` is set, when given.

    Same order: the app's lifespan starts, the listeners serve until
    ``shutdown_trigger`` returns, connections in progress get ``graceful_timeout``, then
    the lifespan ends. Reports the bound URLs through ``task_status``.
    """
    wrapped = wrap_app(app, config.wsgi_max_body_size, None)
    lifespan_state: dict[str, object] = {}
    lifespan = Lifespan(wrapped, config, lifespan_state)
    context = WorkerContext(None)
    connections = ClientConnections(max_connections, per_client)
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as server_nursery:
            listeners = [
                CappedListener(
                    trio.SocketListener(trio.socket.from_stdlib_socket(sock)), connections, opened
                )
                for sock in sockets.insecure_sockets
            ]
            binds = [
                f"http://{repr_socket_addr(sock.family, sock.getsockname())}"
                for sock in sockets.insecure_sockets
            ]
            for bind in binds:
                await config.log.info(f"Running on {bind} (CTRL + C to quit)")
            task_status.started(binds)
            handler = partial(
                _Connection, app, wrapped, config, context, ConnectionState(lifespan_state)
            )
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
