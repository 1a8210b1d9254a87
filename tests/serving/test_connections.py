"""Kept-alive connections on a real server: reused while busy, closed once idle.

Raw sockets, so that nothing but the server decides when a connection ends.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from tests.conftest import Gateway, make_config, start_gateway
from tests.support.fake_client import closed_within, connect, exchange, models

IDLE_S = 1.0


@pytest.fixture
async def idle_gateway(nursery: trio.Nursery, tmp_path: Path) -> Gateway:
    return await start_gateway(nursery, make_config(tmp_path, connection_idle_s=IDLE_S))


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


@pytest.mark.parametrize("kind", ["catalog", "call", "streamed call"])
async def test_an_idle_connection_is_closed_after_its_answer(
    idle_gateway: Gateway, kind: str
) -> None:
    gw = idle_gateway
    request = {"catalog": models(gw.url), "call": chat(gw, False), "streamed call": chat(gw, True)}
    stream = await connect(gw.url)
    async with stream:
        answer = await exchange(stream, request[kind])
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        waited = await closed_within(stream, IDLE_S + 4)
        assert waited >= IDLE_S - 0.2


async def test_a_connection_in_use_is_kept(
    idle_gateway: Gateway, mock_clock: trio.testing.MockClock
) -> None:
    """Requests closer together than the idle timeout share one connection throughout;
    once one is followed by a whole timeout without a request, the connection is closed.
    On virtual time: the server's idle timer runs on trio's clock, which only this test
    moves, once the server has done all it can (every task blocked)."""
    gw = idle_gateway
    stream = await connect(gw.url)
    async with stream:
        for _ in range(4):  # three timeouts' worth of time, in gaps of 3/4 of one
            answer = await exchange(stream, models(gw.url))
            assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
            await trio.testing.wait_all_tasks_blocked()
            mock_clock.jump(IDLE_S * 3 / 4)
        answer = await exchange(stream, models(gw.url))
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(IDLE_S)
        mock_clock.autojump_threshold = 0  # the bound below runs on virtual time too
        await closed_within(stream, IDLE_S / 4)


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
    # the server (in this process) has read all it was sent, the headers and part of
    # the body, once every task waits: it waits for the rest of the body
    with trio.fail_after(5):
        await trio.testing.wait_all_tasks_blocked()
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    if path.endswith("embeddings"):
        body = {"model": "text-embedding-3-small", "input": "hi"}
    async with gateway.client(key["token"]) as client:
        served = await client.post(path, json=body)
        status = (await client.get("/v1/key")).json()["rate_limit"]
    assert served.status_code == 200, served.text
    assert status["in_flight"] == 0
    await stalled.aclose()
