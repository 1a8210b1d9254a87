"""How hypercorn's patched connection (gateway/serving/patches/hypercorn_worker.py) writes
an answer and calls the app, on a real server (``serve_http``) over loopback TCP, with a
small ASGI app whose steps the test releases one at a time."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import pytest
import trio
import trio.testing

from gateway.edge.asgi import BODY_FOLLOWS, disconnect_watch
from gateway.serving.patches.hypercorn_worker import ServerConfig, serve_http
from gateway.serving.server import bind_sockets

REQUEST = b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n"


class _StepApp:
    """An ASGI app that sends a head, waits for ``release``, then the body (``more``:
    in two body messages)."""

    def __init__(self, body_follows: bool, more: bool = False) -> None:
        self.body_follows = body_follows
        self.more = more
        self.started = trio.Event()
        self.release = trio.Event()
        self.watched_gone = 0
        self.gone = trio.Event()
        self.calls = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        self.calls += 1
        watch = disconnect_watch(scope)
        assert watch is not None
        watch(self._gone)
        sized = [] if self.more else [(b"content-length", b"2")]
        start = {"type": "http.response.start", "status": 200, "headers": sized}
        if self.body_follows:
            start[BODY_FOLLOWS] = True
        await send(start)
        self.started.set()
        await self.release.wait()
        if self.more:
            await send({"type": "http.response.body", "body": b"hel", "more_body": True})
        await send({"type": "http.response.body", "body": b"lo", "more_body": False})

    def _gone(self) -> None:
        self.watched_gone += 1
        self.gone.set()


@asynccontextmanager
async def _served(app: _StepApp) -> AsyncIterator[trio.SocketStream]:
    """A client connection to ``serve_http`` serving ``app``."""
    config = ServerConfig()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    sockets = bind_sockets(config)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(
            partial(serve_http, app, config, sockets, 10, 10, shutdown_trigger=stop.wait)
        )
        port = int(urls[0].rpartition(":")[2])
        client = await trio.open_tcp_stream("127.0.0.1", port)
        try:
            yield client
        finally:
            await client.aclose()
            stop.set()


async def _answer(client: trio.SocketStream) -> bytes:
    received = b""
    while not received.endswith(b"lo") and not received.endswith(b"0\r\n\r\n"):
        received += await client.receive_some()
    return received


@pytest.mark.parametrize("body_follows", [True, False])
async def test_a_head_whose_body_follows_waits_for_it_and_goes_out_with_it(
    body_follows: bool,
) -> None:
    app = _StepApp(body_follows)
    async with _served(app) as client:
        await client.send_all(REQUEST)
        await app.started.wait()
        await trio.testing.wait_all_tasks_blocked()
        # the head was sent by the app: written at once, unless its body follows
        assert client.socket.is_readable() is not body_follows
        app.release.set()
        answer = await _answer(client)
        assert answer.startswith(b"HTTP/1.1 200")
        assert answer.endswith(b"\r\n\r\nlo")  # a sized body, head and body whole


async def test_the_held_head_goes_with_the_first_body_message_of_several() -> None:
    app = _StepApp(body_follows=True, more=True)
    async with _served(app) as client:
        await client.send_all(REQUEST)
        await app.started.wait()
        await trio.testing.wait_all_tasks_blocked()
        assert not client.socket.is_readable()
        app.release.set()
        answer = await _answer(client)
        assert answer.startswith(b"HTTP/1.1 200")
        assert b"transfer-encoding: chunked" in answer.lower()
        assert answer.endswith(b"3\r\nhel\r\n2\r\nlo\r\n0\r\n\r\n")


async def test_the_answers_own_end_is_no_client_gone_and_the_connection_serves_again() -> None:
    """The disconnect hypercorn hands the app with the last body message does not reach
    the app's watch (it would cancel the request half-way through that send), and the
    kept-alive connection serves its next request."""
    app = _StepApp(body_follows=True)
    app.release.set()
    async with _served(app) as client:
        for _ in range(2):
            await client.send_all(REQUEST)
            answer = await _answer(client)
            assert answer.startswith(b"HTTP/1.1 200")
        await trio.testing.wait_all_tasks_blocked()
        assert (app.calls, app.watched_gone) == (2, 0)


async def test_a_client_gone_mid_answer_is_told_to_the_app() -> None:
    app = _StepApp(body_follows=False)
    async with _served(app) as client:
        await client.send_all(REQUEST)
        await app.started.wait()
        await client.aclose()
        with trio.fail_after(5):
            await app.gone.wait()
        assert app.watched_gone == 1
        app.release.set()


async def test_a_request_cut_by_the_servers_end_gets_no_bare_500() -> None:
    """A server cancelled whole (a node that finds itself fenced) while a request has no
    answer yet: its connection closes with nothing written. hypercorn's closing send
    answered such a request with a bare 500 once writes stopped passing a checkpoint."""
    started = trio.Event()

    async def silent(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _StepApp(False)(scope, receive, send)
            return
        started.set()
        await trio.sleep_forever()

    config = ServerConfig()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    sockets = bind_sockets(config)
    async with trio.open_nursery() as nursery:
        serving = partial(serve_http, silent, config, sockets, 10, 10)
        urls = await nursery.start(partial(serving, shutdown_trigger=trio.sleep_forever))
        client = await trio.open_tcp_stream("127.0.0.1", int(urls[0].rpartition(":")[2]))
        await client.send_all(REQUEST)
        await started.wait()
        nursery.cancel_scope.cancel()
    received = b""
    with trio.fail_after(5):
        while data := await client.receive_some():
            received += data
    await client.aclose()
    assert received == b""
