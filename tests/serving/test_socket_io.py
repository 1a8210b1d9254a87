"""The plain-socket sends and receives of the hot path
(gateway/serving/patches/trio_socket.py) and the store's connection threads
(gateway/store/thread.py), on real loopback TCP connections and real threads."""

from __future__ import annotations

import socket
import ssl
import struct
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from gateway.serving.patches import trio_socket as socket_io
from gateway.store.thread import ConnThread


@asynccontextmanager
async def _pair() -> AsyncIterator[tuple[trio.SocketStream, trio.SocketStream]]:
    """Two ends of one loopback TCP connection, as trio streams."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    client = await trio.open_tcp_stream("127.0.0.1", port)
    server = await listeners[0].accept()
    await listeners[0].aclose()
    try:
        assert isinstance(server, trio.SocketStream)
        yield client, server
    finally:
        await client.aclose()
        await server.aclose()


class _Steps(trio.abc.Instrument):
    """How many times the current task passed through the scheduler."""

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task, self.count = task, 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.count += 1


async def test_bytes_go_both_ways_whole_and_large_sends_wait_for_room() -> None:
    async with _pair() as (client, server):
        raw_client, raw_server = socket_io.raw_socket(client), socket_io.raw_socket(server)
        assert raw_client is not None and raw_server is not None
        big = bytes(range(256)) * 40_000  # ~10 MB: more than the kernel's buffers take

        received = bytearray()

        async def read_all() -> None:
            while len(received) < len(big):
                received.extend(await socket_io.receive_some(raw_server, 1 << 16))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_all)
            await socket_io.send_all(client, raw_client, big)
        assert received == big
        await socket_io.send_all(server, raw_server, b"pong")
        assert await socket_io.receive_some(raw_client) == b"pong"


async def test_a_send_that_fits_takes_no_scheduler_pass_and_a_receive_takes_one() -> None:
    async with _pair() as (client, server):
        raw_client, raw_server = socket_io.raw_socket(client), socket_io.raw_socket(server)
        assert raw_client is not None and raw_server is not None
        steps = _Steps(trio.lowlevel.current_task())
        trio.lowlevel.add_instrument(steps)
        try:
            await socket_io.send_all(client, raw_client, b"x" * 1000)
            assert steps.count == 0
            # the data is there already: one pass after reading it
            assert await socket_io.receive_some(raw_server) == b"x" * 1000
            assert steps.count == 1
            # nothing there yet: one pass, while waiting (trio's stream passes again after)
            go = trio.Event()

            async def answer_later() -> None:
                await go.wait()
                await socket_io.send_all(server, raw_server, b"later")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(answer_later)
                await trio.testing.wait_all_tasks_blocked()
                steps.count = 0
                go.set()
                assert await socket_io.receive_some(raw_client) == b"later"
                assert steps.count == 1
        finally:
            trio.lowlevel.remove_instrument(steps)


async def test_errors_are_the_streams_and_an_idle_connection_is_told_from_a_used_one() -> None:
    async with _pair() as (client, server):
        raw_client, raw_server = socket_io.raw_socket(client), socket_io.raw_socket(server)
        assert raw_client is not None and raw_server is not None
        assert socket_io.idle_and_open(raw_client)
        await server.send_all(b"unasked")
        await trio.lowlevel.wait_readable(raw_client)
        assert not socket_io.idle_and_open(raw_client)
        assert await socket_io.receive_some(raw_client) == b"unasked"  # a peek took nothing
        assert socket_io.idle_and_open(raw_client)

        # the peer resets the connection: it is not idle, and sends fail as a broken stream
        raw_server.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await server.aclose()
        await trio.lowlevel.wait_readable(raw_client)
        assert not socket_io.idle_and_open(raw_client)
        with pytest.raises(trio.BrokenResourceError):
            for _ in range(100):
                await socket_io.send_all(client, raw_client, b"y" * 65536)
        await client.aclose()
        with pytest.raises(trio.ClosedResourceError):
            await socket_io.send_all(client, raw_client, b"z")
        with pytest.raises(trio.ClosedResourceError):
            await socket_io.receive_some(raw_client)


async def test_a_tls_stream_has_no_plain_socket() -> None:
    async with _pair() as (client, _):
        tls = trio.SSLStream(client, ssl.create_default_context())
        assert socket_io.raw_socket(tls) is None


async def test_a_conn_thread_runs_calls_in_order_on_one_thread_and_raises_their_errors() -> None:
    worker = ConnThread("test worker")
    seen: list[tuple[int, int]] = []

    def note(n: int) -> int:
        seen.append((n, threading.get_ident()))
        return n * 2

    def fail() -> None:
        raise ValueError("from the thread")

    try:
        results: list[int] = []

        async def call(n: int) -> None:
            results.append(await worker.run(note, n))

        async with trio.open_nursery() as nursery:
            for n in range(20):
                nursery.start_soon(call, n)
        assert sorted(results) == [2 * n for n in range(20)]
        assert len({ident for _, ident in seen}) == 1
        assert seen[0][1] != threading.get_ident()
        with pytest.raises(ValueError, match="from the thread"):
            await worker.run(fail)
    finally:
        worker.stop()


async def test_a_conn_thread_call_cancelled_waits_or_is_abandoned() -> None:
    worker = ConnThread("test worker")
    release = threading.Event()
    done: list[str] = []

    def slow(name: str, seconds: float) -> None:
        release.wait(seconds)
        done.append(name)

    try:
        # not abandoned: a cancelled caller still waits for the call's end
        with trio.move_on_after(0.05):
            await worker.run(slow, "waited", 0.3)
        assert done == ["waited"]
        # abandoned: the caller leaves at once; the call still runs to its end, in order
        with trio.move_on_after(0.05):
            await worker.run(slow, "abandoned", 30, abandon_on_cancel=True)
        assert done == ["waited"]
        release.set()
        assert await worker.run(lambda: "after") == "after"
        assert done == ["waited", "abandoned"]
    finally:
        worker.stop()
