"""Request bodies on a real server: read after authentication, within a deadline, a
minimum rate and a shared budget; discarded, never kept, when the request is refused.

Raw loopback sockets, so that the test alone decides how fast a body arrives.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from gateway.edge.bodies import MIN_RATE, MIN_RATE_GRACE_S
from gateway.providers.mock import MockProvider
from tests.conftest import Gateway, make_config, start_gateway
from tests.support.fake_client import (
    chat_body,
    closed_within,
    connect,
    error_of,
    exchange,
    head,
    models,
    read_answer,
    send_paced,
    status_of,
    trickle,
)
from tests.support.waiting import until


@pytest.fixture
async def quick(nursery: trio.Nursery, tmp_path: Path) -> Gateway:
    """A body must arrive within 1.5 s."""
    return await start_gateway(nursery, make_config(tmp_path, body_timeout_s=1.5))


@pytest.mark.parametrize("token", [True, False], ids=["authenticated", "unauthenticated"])
async def test_a_trickling_body_gets_408_at_the_deadline_and_the_connection_closes(
    quick: Gateway, token: bool
) -> None:
    gw = quick
    stream = await connect(gw.url)
    async with stream, trio.open_nursery() as nursery:
        await stream.send_all(head(gw.url, 1000, gw.token if token else None) + b"{")
        start = trio.current_time()
        nursery.start_soon(trickle, stream, 0.1)
        answer = await read_answer(stream)
        took = trio.current_time() - start
        if token:
            assert status_of(answer) == 408, answer
            error = error_of(answer)
            assert (error["code"], error["type"]) == (
                "request_body_timeout",
                "invalid_request_error",
            )
            assert 1.4 <= took < 2.5, took
        else:
            # refused from the headers; its body is discarded under the same deadline
            assert status_of(answer) == 401, answer
            assert 1.4 <= took < 2.5, took
        assert b"connection: close" in answer.lower()
        await closed_within(stream, 3)
        nursery.cancel_scope.cancel()


async def test_a_body_below_the_minimum_rate_is_cut_after_the_grace(gateway: Gateway) -> None:
    """The default 30 s deadline, but one byte every 0.25 s is below the minimum rate."""
    assert gateway.runtime.config.server.body_timeout_s == 30
    stream = await connect(gateway.url)
    async with stream, trio.open_nursery() as nursery:
        await stream.send_all(head(gateway.url, 100_000, gateway.token))
        start = trio.current_time()
        nursery.start_soon(trickle, stream, 0.25)
        answer = await read_answer(stream)
        took = trio.current_time() - start
        nursery.cancel_scope.cancel()
    assert status_of(answer) == 408, answer
    assert MIN_RATE_GRACE_S - 0.2 <= took < MIN_RATE_GRACE_S + 1.5, took


async def test_a_slow_steady_body_above_the_minimum_rate_is_read(gateway: Gateway) -> None:
    """Twice the minimum rate for longer than the grace: the body is served."""
    body = chat_body(int(2 * MIN_RATE * (MIN_RATE_GRACE_S + 1.5)))
    stream = await connect(gateway.url)
    async with stream:
        await stream.send_all(head(gateway.url, len(body), gateway.token))
        await send_paced(stream, body, step=MIN_RATE // 5, every=0.1)
        answer = await read_answer(stream)
    assert status_of(answer) == 200, answer[:300]


@pytest.mark.parametrize("token", [True, False], ids=["authenticated", "unauthenticated"])
async def test_a_refused_body_is_discarded_and_the_connection_kept(
    gateway: Gateway, token: bool
) -> None:
    """A 403 (scope) or 401 decided from the headers: the body is read and dropped, and
    the next request on the same connection is served."""
    key = await gateway.create_key(name="no-inference", scopes=["embeddings"])
    body = chat_body(3 * 1024 * 1024)
    stream = await connect(gateway.url)
    async with stream:
        await stream.send_all(head(gateway.url, len(body), key["token"] if token else None) + body)
        answer = await read_answer(stream)
        assert status_of(answer) == (403 if token else 401), answer
        assert b"connection: close" not in answer.lower()
        again = await exchange(stream, models(gateway.url))
    assert again.startswith(b"HTTP/1.1 200"), again[:200]


async def test_a_chunked_body_is_read_and_one_over_the_limit_is_413(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    gw = await start_gateway(nursery, make_config(tmp_path, max_body_bytes=4096))
    body = chat_body(1000)
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:500], body[500:]))
    stream = await connect(gw.url)
    async with stream:
        await stream.send_all(head(gw.url, None, gw.token) + chunked + b"0\r\n\r\n")
        answer = await read_answer(stream)
        assert status_of(answer) == 200, answer[:300]
        big = b"1000\r\n" + b" " * 4096 + b"\r\n" + b"10\r\n" + b" " * 16 + b"\r\n0\r\n\r\n"
        await stream.send_all(head(gw.url, None, gw.token) + big)
        answer = await read_answer(stream)
        assert status_of(answer) == 413, answer[:300]
        assert b"connection: close" in answer.lower()
        await closed_within(stream, 3)


async def test_bodies_past_the_budget_wait_then_are_refused_503(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    """A budget of two bodies, held by two slow streamed calls (a body counts until its
    request is answered): a third waits for room, unread, and is served when one call
    ends; a fourth is 503 (retryable, Retry-After) when none ends within the wait
    (body_timeout_s)."""
    size, wait = 100_000, 2.0
    config = make_config(
        tmp_path,
        max_body_bytes=size,
        max_buffered_body_bytes=2 * size,
        body_timeout_s=wait,
        keepalive_s=0.3,  # a stream answers 200 at its first keep-alive
    )
    gw = await start_gateway(nursery, config)
    gw.runtime.mock = MockProvider.for_models(gw.runtime.config.models, chunk_delay=5.0)
    body = chat_body(size, stream=True)

    async def started(stream: trio.SocketStream) -> None:
        await stream.send_all(head(gw.url, len(body), gw.token) + body)
        with trio.fail_after(5):
            assert (await stream.receive_some(12)).startswith(b"HTTP/1.1 200")

    held = [await connect(gw.url), await connect(gw.url)]
    for stream in held:
        await started(stream)
    third = await connect(gw.url)
    async with third:
        await third.send_all(head(gw.url, len(body), gw.token) + body)
        with trio.move_on_after(1.0):
            early = await third.receive_some(1)
            pytest.fail(f"answered while the budget was full: {early!r}")
        await held.pop().aclose()  # that call ends: its share goes back
        with trio.fail_after(5):
            assert (await third.receive_some(12)).startswith(b"HTTP/1.1 200")
        fourth = await connect(gw.url)
        async with fourth:
            start = trio.current_time()
            await fourth.send_all(head(gw.url, len(body), gw.token) + body)
            answer = await read_answer(fourth)
            took = trio.current_time() - start
    await held[0].aclose()
    gw.stop.set()
    assert status_of(answer) == 503, answer[:300]
    assert error_of(answer)["code"] == "service_unavailable"
    assert b"retry-after: 1" in answer.lower()
    assert wait - 0.2 <= took < wait + 2


async def test_a_client_that_leaves_mid_body_is_recorded_as_leaving(
    gateway: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    """The body is cut off by the client closing its connection: the request ends as the
    client leaving (its disconnect, held until the body is settled, ends it), and nothing
    of the call is left in flight."""

    def chat_requests() -> list[dict[str, object]]:
        return [
            record.svc_fields
            for record in caplog.records
            if getattr(record, "svc_event", None) == "request"
            and record.svc_fields["path"] == "/v1/chat/completions"
        ]

    with caplog.at_level("INFO", logger="gateway.request"):
        stream = await connect(gateway.url)
        async with stream:
            await stream.send_all(head(gateway.url, 1000, gateway.token) + b'{"model": "mock')
        (line,) = await until(chat_requests, within=10)
    assert (line["status"], line["code"]) == (499, "client_closed"), line
    assert len(gateway.runtime.inflight) == 0
