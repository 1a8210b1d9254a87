"""The lean upstream HTTP/1.1 client (gateway/providers/http1.py) against a real loopback
server that answers with exact bytes: the framings an upstream may use, connection reuse,
and the three failures."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path

import orjson
import pytest
import trio
import trustme

from gateway.calls.provider_errors import map_provider_error
from gateway.config.settings import ModelConfig, ProviderConfig
from gateway.providers.base import ProviderRequest, ProviderUnreachable
from gateway.providers.http1 import (
    MAX_HEAD,
    HTTP1Pool,
    Lost,
    Response,
    TimedOut,
    Unreachable,
    proxy_for,
)
from gateway.providers.openai import OpenAIProvider
from tests.conftest import make_config, start_gateway

Answer = Callable[[trio.SocketStream, bytes], Awaitable[bool]]


async def _request(stream: trio.SocketStream, buffer: bytearray) -> bytes | None:
    """One request (head and Content-Length body) from ``stream``; None at its end."""
    while b"\r\n\r\n" not in buffer:
        data = await stream.receive_some(65536)
        if not data:
            return None
        buffer += data
    end = buffer.index(b"\r\n\r\n") + 4
    head = bytes(buffer[:end])
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(buffer) < end + length:
        buffer += await stream.receive_some(65536)
    request = bytes(buffer[: end + length])
    del buffer[: end + length]
    return request


@asynccontextmanager
async def server(
    answer: Answer, tls: ssl.SSLContext | None = None
) -> AsyncIterator[tuple[str, list[bytes], list[int]]]:
    """A loopback server: ``answer(stream, request)`` per request, True to keep the
    connection; over TLS with ``tls``. Yields its URL, the requests received and each
    connection's request count."""
    requests: list[bytes] = []
    per_connection: list[int] = []

    async def handle(stream: trio.SocketStream) -> None:
        per_connection.append(0)
        index = len(per_connection) - 1
        buffer = bytearray()
        async with stream:
            try:
                while (request := await _request(stream, buffer)) is not None:
                    requests.append(request)
                    per_connection[index] += 1
                    if not await answer(stream, request):
                        return
            except trio.BrokenResourceError:
                return  # the client reset it (closed with an answer unread)

    async with trio.open_nursery() as nursery:
        if tls is None:
            serve = partial(trio.serve_tcp, handle, 0, host="127.0.0.1")
        else:
            serve = partial(trio.serve_ssl_over_tcp, handle, 0, tls, host="127.0.0.1")
        listeners = await nursery.start(serve)
        sock = getattr(listeners[0], "transport_listener", listeners[0]).socket
        scheme = "http" if tls is None else "https"
        yield f"{scheme}://127.0.0.1:{sock.getsockname()[1]}/v1", requests, per_connection
        nursery.cancel_scope.cancel()


def canned(*parts: bytes, keep: bool = True) -> Answer:
    async def answer(stream: trio.SocketStream, request: bytes) -> bool:
        for part in parts:
            await stream.send_all(part)
        return keep

    return answer


def pool(url: str, timeout: float = 5.0) -> HTTP1Pool:
    return HTTP1Pool(url, max_connections=4, timeout=timeout, connect_timeout=5.0)


async def body_of(response: Response) -> list[bytes]:
    try:
        return [piece async for piece in response.iter_body()]
    finally:
        await response.aclose()


async def test_a_sized_answer_is_read_and_its_connection_reused() -> None:
    answer = canned(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello")
    async with server(answer) as (url, requests, per_connection):
        client = pool(url)
        for _ in range(3):
            response = await client.post("/chat/completions", {"Authorization": "Bearer k"}, b"{}")
            assert response.status == 200 and response.headers[b"x-a"] == b"1"
            assert b"".join(await body_of(response)) == b"hello"
        await client.aclose()
    assert per_connection == [3]
    assert requests[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert b"\r\nAuthorization: Bearer k\r\n" in requests[0]
    assert requests[0].endswith(b"\r\n\r\n{}")


async def test_a_chunked_answer_comes_piece_by_piece_past_an_interim_answer() -> None:
    gate = trio.Event()

    async def answer(stream: trio.SocketStream, request: bytes) -> bool:
        await stream.send_all(b"HTTP/1.1 100 Continue\r\n\r\n")
        await stream.send_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        await stream.send_all(b"6;ext=1\r\ndata: \r\n3\r\n{}\n\r\n")
        await gate.wait()
        await stream.send_all(b"1\r\n\n\r\n0\r\nX-Trailer: t\r\n\r\n")
        return True

    async with server(answer) as (url, _, per_connection):
        client = pool(url)
        response = await client.post("/x", {}, b"")
        pieces = response.iter_body()
        assert await pieces.__anext__() == b"data: {}\n"  # two chunks of one read, joined
        gate.set()
        assert [piece async for piece in pieces] == [b"\n"]
        await response.aclose()
        again = await client.post("/x", {}, b"")
        gate = trio.Event()
        gate.set()
        assert b"".join(await body_of(again)) == b"data: {}\n\n"
        await client.aclose()
    assert per_connection == [2]  # the trailers were read: the connection stayed usable


async def test_an_answer_without_length_ends_with_its_connection() -> None:
    answer = canned(b"HTTP/1.0 200 OK\r\n\r\npart one ", b"part two", keep=False)
    async with server(answer) as (url, _, per_connection):
        client = pool(url)
        for _ in range(2):
            response = await client.post("/x", {}, b"")
            assert b"".join(await body_of(response)) == b"part one part two"
        await client.aclose()
    assert per_connection == [1, 1]


async def test_an_unread_body_closes_its_connection() -> None:
    answer = canned(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n", b"ab")
    async with server(answer) as (url, _, per_connection):
        client = pool(url)
        response = await client.post("/x", {}, b"")
        await response.aclose()  # the body was not read to its end
        response = await client.post("/x", {}, b"")
        await response.aclose()
        await client.aclose()
    assert per_connection == [1, 1]


async def test_failures_before_and_after_the_answer() -> None:
    async with server(canned(keep=False)) as (url, _, _):
        with pytest.raises(Lost):  # closed before any answer
            await pool(url).post("/x", {}, b"")
    cut = canned(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", keep=False)
    async with server(cut) as (url, _, _):
        response = await pool(url).post("/x", {}, b"")
        with pytest.raises(Lost):
            await body_of(response)

    async def silent(stream: trio.SocketStream, request: bytes) -> bool:
        await trio.sleep_forever()
        return False

    async with server(silent) as (url, _, _):
        with pytest.raises(TimedOut):
            await pool(url, timeout=0.2).post("/x", {}, b"")
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()  # nothing listens there
    with pytest.raises(Unreachable):
        await pool(f"http://127.0.0.1:{port}").post("/x", {}, b"")
    with pytest.raises(Unreachable):
        await pool("http://127.0.0.1:1").post("/x", {"Authorization": "a\r\nX: b"}, b"")
    with pytest.raises(Unreachable):  # a host name that is not ASCII: refused when used
        await pool("http://exämple.test/v1").post("/x", {}, b"")


async def test_a_silent_upstream_is_ended_by_the_nearer_of_two_deadlines() -> None:
    """A read takes its timeout's scope only when that timeout could end it first: under
    a nearer deadline (a call's) the caller's scope ends it; under a farther one the read
    timeout does (TimedOut) while the caller's deadline is still ahead."""

    async def silent(stream: trio.SocketStream, request: bytes) -> bool:
        await trio.sleep_forever()
        return False

    async with server(silent) as (url, _, _):
        with trio.move_on_after(0.2) as nearer:
            await pool(url, timeout=30.0).post("/x", {}, b"")
        assert nearer.cancelled_caught
        with trio.move_on_after(30.0) as farther, pytest.raises(TimedOut):
            await pool(url, timeout=0.2).post("/x", {}, b"")
        assert not farther.cancelled_caught


@pytest.mark.parametrize("length", [b"1_0", b"+5", b"-5", b"\x0b5", b"5\x0c", b"5, 6"])
async def test_a_content_length_of_anything_but_digits_is_refused(length: bytes) -> None:
    """``int()`` took "1_0", "+5" and whitespace of any kind; h11 takes digits only."""
    wire = b"HTTP/1.1 200 OK\r\nContent-Length: %s\r\n\r\n0123456789" % length
    async with server(canned(wire, keep=False)) as (url, _, _):
        client = pool(url)
        with pytest.raises(Lost):
            await body_of(await client.post("/x", {}, b""))
        await client.aclose()


@pytest.mark.parametrize("length", [b"  5 ", b"5, 5", b"5\r\nContent-Length: 5"])
async def test_a_content_length_with_spaces_around_or_repeated_is_one_number(
    length: bytes,
) -> None:
    """Spaces around a field value are not the value's (RFC 9110 5.5), and a number sent
    twice is that number (RFC 9110 8.6)."""
    wire = b"HTTP/1.1 200 OK\r\nContent-Length: %s\r\n\r\n0123456789" % length
    async with server(canned(wire, keep=False)) as (url, _, _):
        client = pool(url)
        assert b"".join(await body_of(await client.post("/x", {}, b""))) == b"01234"
        await client.aclose()


FRAMED_TWICE = [
    b"Transfer-Encoding: chunked\r\nContent-Length: %d",
    b"Content-Length: %d\r\nTransfer-Encoding: chunked",
]


def completion_framed_twice(framing: bytes) -> bytes:
    """A chat completion whose chunked body is whole, with a Content-Length too."""
    body = orjson.dumps({"id": "c", "object": "chat.completion", "choices": []})
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    return b"HTTP/1.1 200 OK\r\n%s\r\n\r\n%s" % (framing % len(body), chunked)


@pytest.mark.parametrize("framing", FRAMED_TWICE)
async def test_an_answer_framed_twice_is_refused_as_a_provider_failure(framing: bytes) -> None:
    """Transfer-Encoding with Content-Length: RFC 9112 lets the first win, but two readers
    that disagree on which is the response-smuggling shape; h11 reads it, this client
    refuses it, and the provider reports the upstream unreachable (503)."""
    async with server(canned(completion_framed_twice(framing))) as (url, _, per_connection):
        client = pool(url)
        with pytest.raises(Lost):
            await client.post("/x", {}, b"")
        await client.aclose()
        provider = OpenAIProvider(ProviderConfig(name="up", kind="openai", base_url=url))
        request = ProviderRequest(upstream_model="m", body={"model": "m", "messages": []})
        with pytest.raises(ProviderUnreachable) as refused:
            await provider.complete(request)
        with pytest.raises(ProviderUnreachable):
            async for _ in provider.stream(request):
                pass
        await provider.aclose()
    assert per_connection == [1, 1, 1]  # never kept
    error, _ = map_provider_error(refused.value, byok=False)
    assert (error.status, error.code) == (503, "service_unavailable")


async def test_an_answer_framed_twice_is_a_503_through_the_gateway(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    answer = canned(completion_framed_twice(FRAMED_TWICE[0]))
    async with server(answer) as (url, requests, _):
        config = make_config(tmp_path)
        provider = ProviderConfig(name="up", kind="openai", base_url=url)
        model = ModelConfig(
            "framed-twice", "up", "up-m", input_usd_per_mtok=1.0, output_usd_per_mtok=1.0
        )
        gw = await start_gateway(
            nursery, replace(config, providers=(*config.providers, provider), models=(model,))
        )
        try:
            created = await gw.admin("POST", "/admin/orgs", {"name": "o", "credits_usd": 10})
            key = await gw.create_key(org_id=created.json()["id"], mode="live")
            body = {"model": "framed-twice", "messages": [{"role": "user", "content": "hi"}]}
            async with gw.client(key["token"]) as client:
                response = await client.post("/v1/chat/completions", json=body)
        finally:
            await gw.aclose()
    assert response.status_code == 503, response.text
    assert len(requests) == 1
    assert response.json()["error"]["code"] == "service_unavailable"


@pytest.mark.parametrize(
    "wire",
    [
        b"HTTP/1.1 2000 OK\r\nContent-Length: 2\r\n\r\nok",  # int() read "200"
        b"HTTP/1.1 +20 OK\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200OK\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/2.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
        b"ICY 200 OK\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nX-A : 1\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nX-A 1\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-A: " + b"a" * 2 * MAX_HEAD + b"\r\n\r\n",
    ],
)
async def test_a_malformed_head_is_refused(wire: bytes) -> None:
    async with server(canned(wire, keep=False)) as (url, _, _):
        client = pool(url)
        with pytest.raises(Lost):
            await body_of(await client.post("/x", {}, b""))
        await client.aclose()


@pytest.mark.parametrize(
    "chunks",
    [
        b"+a\r\n0123456789\r\n",  # int(, 16) took a sign, "0x", "_" and spaces
        b"0xa\r\n0123456789\r\n",
        b"1_0\r\n0123456789abcdef\r\n",
        b" a\r\n0123456789\r\n",
        b"a\r\n0123456789XY",  # longer than its size (the old parser skipped 2 bytes)
    ],
)
async def test_a_malformed_chunk_is_refused(chunks: bytes) -> None:
    wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%s0\r\n\r\n" % chunks
    async with server(canned(wire, keep=False)) as (url, _, _):
        client = pool(url)
        with pytest.raises(Lost):
            await body_of(await client.post("/x", {}, b""))
        await client.aclose()


@pytest.mark.parametrize(
    ("wire", "kept"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", True),
        (b"HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok", True),  # no reason phrase
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", True),
        (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok", True),
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", False),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", False),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1", False),  # bytes unasked
    ],
)
async def test_a_connection_is_kept_unless_either_side_ends_it(wire: bytes, kept: bool) -> None:
    async with server(canned(wire)) as (url, _, per_connection):
        client = pool(url)
        for _ in range(2):
            assert b"".join(await body_of(await client.post("/x", {}, b""))) == b"ok"
        await client.aclose()
    assert per_connection == ([2] if kept else [1, 1])


async def test_a_request_waits_for_a_free_connection_up_to_the_timeout() -> None:
    answer = canned(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    async with server(answer) as (url, _, _):
        client = HTTP1Pool(url, max_connections=1, timeout=0.2, connect_timeout=1.0)
        held = await client.post("/x", {}, b"")
        with pytest.raises(Unreachable):
            await client.post("/x", {}, b"")
        assert b"".join(await body_of(held)) == b"ok"
        assert b"".join(await body_of(await client.post("/x", {}, b""))) == b"ok"
        await client.aclose()


async def test_a_stream_with_any_line_ends_cut_anywhere_is_read_whole() -> None:
    """SSE lines may end in CR, LF or CRLF; the upstream's writes may cut a line (or a
    CRLF) in two."""
    ends = [b"\r\n", b"\r", b"\n"]
    events = b"".join(
        b'data: {"choices": [{"index": 0, "delta": {"content": "%d"}}]}%s%s' % (i, end, end)
        for i, end in enumerate(ends)
    )
    events += b"data: [DONE]\r\n\r\n"
    cuts = [7, 60, 61, 62, len(events) - 3]
    parts = [events[a:b] for a, b in zip([0, *cuts], [*cuts, len(events)], strict=True)]

    async def answer(stream: trio.SocketStream, request: bytes) -> bool:
        await stream.send_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for part in parts:
            await stream.send_all(b"%x\r\n%s\r\n" % (len(part), part))
            await trio.sleep(0.01)  # one read each
        await stream.send_all(b"0\r\n\r\n")
        return True

    async with server(answer) as (url, _, _):
        provider = OpenAIProvider(ProviderConfig(name="up", kind="openai", base_url=url))
        request = ProviderRequest(upstream_model="m", body={"model": "m", "messages": []})
        chunks = [chunk async for chunk in provider.stream(request)]
        await provider.aclose()
    assert [c["choices"][0]["delta"]["content"] for c in chunks] == ["0", "1", "2"]


async def test_https_with_a_trusted_certificate_and_refused_with_an_unknown_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """TLS to the upstream verifies its certificate against the system's trust store
    (here: a throwaway CA named by SSL_CERT_FILE, which OpenSSL reads for the defaults)."""
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    answer = canned(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    async with server(answer, tls=server_context) as (url, requests, _):
        assert url.startswith("https://")
        untrusted = pool(url)
        with pytest.raises(Unreachable):
            await untrusted.post("/x", {}, b"")
        await untrusted.aclose()
        assert requests == []  # nothing was sent over the refused connection
        ca_file = tmp_path / "ca.pem"
        ca.cert_pem.write_to_path(str(ca_file))
        monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
        trusted = pool(url)
        response = await trusted.post("/x", {}, b"{}")
        assert response.status == 200 and b"".join(await body_of(response)) == b"ok"
        await trusted.aclose()
    assert len(requests) == 1 and requests[0].startswith(b"POST /v1/x HTTP/1.1\r\n")


@asynccontextmanager
async def proxy(tunnel_port: int) -> AsyncIterator[tuple[str, list[bytes]]]:
    """A loopback proxy: ``CONNECT`` tunnels to 127.0.0.1:``tunnel_port`` whatever host it
    names; any other request it answers itself. Yields its URL and the heads it received."""
    heads: list[bytes] = []

    async def pipe(source: trio.abc.Stream, sink: trio.abc.Stream, done: trio.Nursery) -> None:
        try:
            while data := await source.receive_some(65536):
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        done.cancel_scope.cancel()

    async def handle(stream: trio.SocketStream) -> None:
        buffer = bytearray()
        async with stream:
            while b"\r\n\r\n" not in buffer:
                buffer += await stream.receive_some(65536)
            heads.append(bytes(buffer[: buffer.index(b"\r\n\r\n") + 4]))
            if not buffer.startswith(b"CONNECT "):
                await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nproxy")
                return
            upstream = await trio.open_tcp_stream("127.0.0.1", tunnel_port)
            await stream.send_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            async with upstream, trio.open_nursery() as nursery:
                nursery.start_soon(pipe, stream, upstream, nursery)
                nursery.start_soon(pipe, upstream, stream, nursery)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
        yield f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}", heads
        nursery.cancel_scope.cancel()


async def test_a_proxy_from_the_environment_tunnels_https_and_takes_plain_http(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """As httpx did: HTTPS_PROXY gets a CONNECT tunnel (with the URL's credentials), and
    TLS to the upstream's own name goes through it; HTTP_PROXY gets the absolute URL.
    NO_PROXY and loopback hosts go direct."""
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("upstream.test").configure_cert(server_context)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
    answer = canned(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    async with (
        server(answer, tls=server_context) as (url, requests, _),
        proxy(int(url.rsplit(":", 1)[1].split("/")[0])) as (proxy_url, heads),
    ):
        monkeypatch.setenv("HTTPS_PROXY", proxy_url.replace("://", "://gw:p%40ss@"))
        monkeypatch.setenv("HTTP_PROXY", proxy_url)
        tunnelled = pool("https://upstream.test/v1")
        response = await tunnelled.post("/x", {}, b"{}")
        assert b"".join(await body_of(response)) == b"ok"
        await tunnelled.aclose()
        forwarded = pool("http://upstream.test:8000/v1")
        response = await forwarded.post("/x", {}, b"{}")
        assert b"".join(await body_of(response)) == b"proxy"
        await forwarded.aclose()
    assert heads[0].startswith(b"CONNECT upstream.test:443 HTTP/1.1\r\n")
    assert b"\r\nProxy-Authorization: Basic Z3c6cEBzcw==\r\n" in heads[0]  # gw:p@ss
    assert requests[0].startswith(b"POST /v1/x HTTP/1.1\r\nHost: upstream.test\r\n")
    assert heads[1].startswith(b"POST http://upstream.test:8000/v1/x HTTP/1.1\r\n")
    assert proxy_for("https", "127.0.0.1") is None and proxy_for("http", "localhost") is None
    monkeypatch.setenv("NO_PROXY", "upstream.test")
    assert proxy_for("https", "upstream.test") is None
