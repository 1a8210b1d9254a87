"""Kept-alive connections on a real server: reused while busy, closed once idle.

Raw sockets, so that nothing but the server decides when a connection ends.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.conftest import Gateway, make_config, start_gateway

IDLE_S = 1.0


@pytest.fixture
async def idle_gateway(nursery: trio.Nursery, tmp_path: Path) -> Gateway:
    return await start_gateway(nursery, make_config(tmp_path, connection_idle_s=IDLE_S))


async def exchange(stream: trio.SocketStream, request: bytes) -> bytes:
    """Send one request and read its whole answer (it ends with the body's last chunk)."""
    await stream.send_all(request)
    data = b""
    with trio.fail_after(10):
        while not (data.endswith(b"0\r\n\r\n") or _complete(data)):
            chunk = await stream.receive_some(65536)
            assert chunk, f"closed mid-answer: {data!r}"
            data += chunk
    return data


def _complete(data: bytes) -> bool:
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False


async def closed_within(stream: trio.SocketStream, seconds: float) -> float:
    """Seconds until the server closes the connection (EOF), failing past ``seconds``."""
    start = trio.current_time()
    with trio.fail_after(seconds):
        assert await stream.receive_some(1) == b""
    return trio.current_time() - start


def models(gw: Gateway) -> bytes:
    host = gw.url.removeprefix("http://")
    return f"GET /v1/models HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()


def chat(gw: Gateway, stream: bool) -> bytes:
    host = gw.url.removeprefix("http://")
    body = (
        b'{"model": "gpt-4o-mini", "max_tokens": 8, "stream": '
        + (b"true" if stream else b"false")
        + b', "messages": [{"role": "user", "content": "hi"}]}'
    )
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {gw.token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def connect(gw: Gateway) -> trio.SocketStream:
    host, port = gw.url.removeprefix("http://").rsplit(":", 1)
    return await trio.open_tcp_stream(host, int(port))


@pytest.mark.parametrize("kind", ["catalog", "call", "streamed call"])
async def test_an_idle_connection_is_closed_after_its_answer(
    idle_gateway: Gateway, kind: str
) -> None:
    gw = idle_gateway
    request = {"catalog": models(gw), "call": chat(gw, False), "streamed call": chat(gw, True)}
    stream = await connect(gw)
    async with stream:
        answer = await exchange(stream, request[kind])
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        waited = await closed_within(stream, IDLE_S + 4)
        assert waited >= IDLE_S - 0.2


async def test_a_connection_in_use_is_kept(idle_gateway: Gateway) -> None:
    """Requests closer together than the idle timeout share one connection throughout."""
    gw = idle_gateway
    stream = await connect(gw)
    async with stream:
        start = trio.current_time()
        while trio.current_time() - start < 3 * IDLE_S:
            answer = await exchange(stream, models(gw))
            assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
            await trio.sleep(IDLE_S / 4)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings"])
async def test_a_body_that_never_finishes_holds_no_in_flight_slot(
    gateway: Gateway, path: str
) -> None:
    key = await gateway.create_key(name="one-slot", caps={"max_in_flight": 1})
    host, port = gateway.url.removeprefix("http://").rsplit(":", 1)
    stalled = await trio.open_tcp_stream(host, int(port))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key['token']}\r\n"
        'Content-Type: application/json\r\nContent-Length: 60\r\n\r\n{"mod'
    )
    await stalled.send_all(head.encode())
    # time for the server to have the headers and part of the body; nothing signals it,
    # and a server that has not read them yet holds no slot either (the test cannot
    # fail falsely, only pass weakly)
    await trio.sleep(0.3)
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    if path.endswith("embeddings"):
        body = {"model": "text-embedding-3-small", "input": "hi"}
    async with gateway.client(key["token"]) as client:
        served = await client.post(path, json=body)
        status = (await client.get("/v1/key")).json()["rate_limit"]
    assert served.status_code == 200, served.text
    assert status["in_flight"] == 0
    await stalled.aclose()
