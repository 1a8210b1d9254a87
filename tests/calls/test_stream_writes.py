"""Who writes a stream's body (gateway/calls/streaming.py): once the head and the first
frames are out, the pump writes each upstream burst itself, and the answer's task wakes
only for keep-alives and the end. A real server in front of the fake OpenAI upstream
(``[[fault chunk_delay]]``: each chunk its own upstream read), the tasks' passes through
trio's scheduler counted by an instrument."""

from __future__ import annotations

import socket
from collections import Counter
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import orjson
import pytest
import trio

from gateway.fakes.fake_upstream import FakeUpstream
from tests.calls.test_live_settlement import UPSTREAM_KEY, body_for, live_config
from tests.conftest import Gateway, start_gateway
from tests.support.waiting import until

CHUNKS = 40
DEADLINE_S = 1.5
#: a stream's worth of frames far over what the kernel buffers for a client that reads
#: nothing (a few hundred kB)
WORDS = 4000
#: the task hypercorn runs the app in, for each request (its ``_handle``, or our copy)
ANSWER_TASK = "._handle"
PUMP_TASK = "gateway.calls.streaming.pump"


class _Steps(trio.abc.Instrument):
    """Passes through the scheduler, by task name."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.counts[ANSWER_TASK if task.name.endswith(ANSWER_TASK) else task.name] += 1


@pytest.fixture
async def live(
    nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Gateway, str]]:
    upstream = await nursery.start(FakeUpstream(max_words=CHUNKS).serve)
    monkeypatch.setenv("FAKE_UPSTREAM_KEY", UPSTREAM_KEY)
    gw = await start_gateway(nursery, live_config(tmp_path, upstream, keepalive_s=60.0))
    key = await gw.create_key(name="live", mode="live", caps={"usd_day": 10})
    yield gw, key["token"]
    gw.stop.set()


async def test_the_pump_writes_each_burst_and_the_answers_task_wakes_only_to_end(
    live: tuple[Gateway, str],
) -> None:
    gw, token = live
    body = body_for("Count. [[fault chunk_delay=0.01]]", max_tokens=CHUNKS, stream=True)
    steps = _Steps()
    trio.lowlevel.add_instrument(steps)
    try:
        async with (
            gw.client(token) as client,
            client.stream("POST", "/v1/chat/completions", json=body) as response,
        ):
            assert response.status_code == 200
            lines = [line async for line in response.aiter_lines() if line.startswith("data:")]
    finally:
        trio.lowlevel.remove_instrument(steps)
    assert len(lines) > CHUNKS and lines[-1] == "data: [DONE]"
    # the pump passes once per upstream read at least; the answer's task a fixed number
    # of times (its request's steps: the body, admission, the pending row, the first
    # frame, the end), not once per burst
    assert steps.counts[PUMP_TASK] >= CHUNKS
    assert steps.counts[ANSWER_TASK] < CHUNKS / 2, steps.counts


async def test_a_client_that_reads_nothing_does_not_hold_the_settlement_past_the_deadline(
    nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pump's write that waits for such a client ends at the call's deadline: the
    call settles (request_timeout) and the connection, its answer cut, is closed."""
    upstream = await nursery.start(FakeUpstream(max_words=WORDS).serve)
    monkeypatch.setenv("FAKE_UPSTREAM_KEY", UPSTREAM_KEY)
    config = live_config(tmp_path, upstream, request_timeout_s=DEADLINE_S)
    gw = await start_gateway(nursery, config)
    token = (await gw.create_key(name="live", mode="live", caps={"usd_day": 10}))["token"]
    body = orjson.dumps(body_for("Talk.", max_tokens=WORDS, stream=True))
    host = gw.url.removeprefix("http://")
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}"
        f"\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    sock = trio.socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # full after a few frames
    await sock.connect(("127.0.0.1", int(host.rpartition(":")[2])))
    client = trio.SocketStream(sock)
    try:
        await client.send_all(request)  # and nothing read: the server's writes fill up
        started = trio.current_time()
        with trio.fail_after(DEADLINE_S + 10):
            rows = await until(partial(_settled, gw), within=DEADLINE_S + 10)
        assert trio.current_time() - started < DEADLINE_S + 5
        assert rows == [("failed", "request_timeout")]
        with trio.fail_after(10):  # what the kernel holds, then the end: the answer is cut
            while await client.receive_some(1 << 16):
                pass
    finally:
        await client.aclose()
    gw.stop.set()


async def _settled(gw: Gateway) -> list[tuple[str, str]]:
    rows = await gw.runtime.store.read(
        lambda conn: conn.execute(
            "SELECT status, error_code FROM requests WHERE status != 'pending'"
        ).fetchall()
    )
    return [(row[0], row[1]) for row in rows]


async def _raw_stream(gw: Gateway, token: str, version: str) -> bytes:
    """A paced stream asked for over a raw socket in HTTP/``version``: the whole answer,
    read until the server closes (1.0) or the chunked body's last chunk (1.1)."""
    body = orjson.dumps(body_for("Count. [[fault chunk_delay=0.005]]", max_tokens=12, stream=True))
    host = gw.url.removeprefix("http://")
    request = (
        f"POST /v1/chat/completions HTTP/{version}\r\nHost: {host}\r\nAuthorization: Bearer "
        f"{token}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    client = await trio.open_tcp_stream("127.0.0.1", int(host.rpartition(":")[2]))
    answer = b""
    try:
        await client.send_all(request)
        with trio.fail_after(10):
            while not answer.endswith(b"\r\n0\r\n\r\n") and (data := await client.receive_some()):
                answer += data
    finally:
        await client.aclose()
    return answer


def _unchunked(body: bytes) -> bytes:
    """A chunked body's bytes, each chunk's size line checked against its data."""
    out, at = b"", 0
    while True:
        line_end = body.index(b"\r\n", at)
        size = int(body[at:line_end], 16)
        if size == 0:
            assert body[line_end:] == b"\r\n\r\n"
            return out
        start = line_end + 2
        assert body[start + size : start + size + 2] == b"\r\n"
        out += body[start : start + size]
        at = start + size + 2


@pytest.mark.parametrize("version", ["1.1", "1.0"])
async def test_a_streamed_answer_is_framed_for_the_clients_http_version(
    live: tuple[Gateway, str], version: str
) -> None:
    """The stream's middle writes skip hypercorn and h11 (hypercorn_worker._Answer) when
    h11 would frame them as chunks: an HTTP/1.1 client gets chunks h11's reader accepts,
    an HTTP/1.0 client (no chunked encoding) the events as they are, until the close."""
    gw, token = live
    head, _, body = (await _raw_stream(gw, token, version)).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head  # a server names its own version
    if version == "1.1":
        assert b"transfer-encoding: chunked" in head.lower()
        events = _unchunked(body)
    else:
        assert b"transfer-encoding" not in head.lower()
        events = body
    lines = [line for line in events.split(b"\n\n") if line]
    assert all(line.startswith(b"data: ") for line in lines), lines
    chunks = [orjson.loads(line[6:]) for line in lines[:-1]]
    assert lines[-1] == b"data: [DONE]" and len(chunks) >= 12
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
