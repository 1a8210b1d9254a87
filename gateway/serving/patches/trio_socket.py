"""Sends and receives on a plain TCP stream with one scheduler pass fewer each.

``trio.SocketStream`` passes through trio's scheduler after every socket call that
succeeds, even one that did not wait, on top of the pass of a wait. On the hot path
(the client's request and answer, the upstream's request and answer) that was about a
fifth of a call's task steps. Here:

- a send that the kernel takes at once returns without a pass (one that must wait for
  room passes through the scheduler while it waits);
- a receive passes through the scheduler exactly once: while it waits for data, or,
  when the data was already there, once after reading it (so a task reading a fast
  peer in a loop still lets the others run, and can still be cancelled there).

Errors are the stream's: a closed socket is ``trio.ClosedResourceError``, any other
``OSError`` is ``trio.BrokenResourceError``. The stdlib socket under a trio socket is
reached through trio's private ``_sock``; a stream without one (TLS, a future trio) uses
its own methods.

Patches trio 0.35.0: reaches ``trio.socket.SocketType``'s private ``_sock`` and stands in
for ``trio.SocketStream.send_all`` and ``receive_some`` (same errors, fewer passes).
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Awaitable, Callable
from typing import TypeAlias

import trio

#: the upstream code this module was reviewed against (see gateway/serving/patches/):
#: qualified name → (version, SHA-256 of its source)
REVIEWED: dict[str, tuple[str, str]] = {
    # sets ``_sock``, the stdlib socket that raw_socket() returns
    "trio._socket._SocketType.__init__": (
        "0.35.0",
        "a8bf543c8bfd9ecf2af566a928e2389d69e298f1f7391c0c96a50148309efc9d",
    ),
    # send_all() and receive_some() below keep their errors and their cancellation
    "trio._highlevel_socket.SocketStream.send_all": (
        "0.35.0",
        "df9f0a360b5bbd20d3b05f9bb9bc1f39fb03098f1786dcab975c9817c9955720",
    ),
    "trio._highlevel_socket.SocketStream.receive_some": (
        "0.35.0",
        "94a55ee3c587ffa7e9fa9e4e21754ce7170765af5a969107d4ca97d037a8a946",
    ),
}

#: what a send takes
Buffer: TypeAlias = bytes | bytearray | memoryview

#: trio's own default for ``receive_some()`` without a size
DEFAULT_RECEIVE_SIZE = 65536


def raw_socket(stream: trio.abc.Stream) -> socket.socket | None:
    """The stdlib socket of a plain ``trio.SocketStream``, else None (trio 0.35.0 keeps
    it in the private ``_sock`` of the stream's trio socket)."""
    if type(stream) is not trio.SocketStream:
        return None
    raw = getattr(stream.socket, "_sock", None)
    return raw if isinstance(raw, socket.socket) else None


def send_now(stream: trio.SocketStream, raw: socket.socket, data: Buffer) -> int:
    """How much of ``data`` the kernel takes at once (0: none): no wait, no pass.

    A caller that sends under a cancel scope (a shield, a write timeout) needs the
    scope only for what is left: on the hot path a send almost never waits, and a
    scope entered and left costs about as much as fifty function calls.
    """
    if stream.socket.did_shutdown_SHUT_WR:
        raise trio.ClosedResourceError("can't send data after sending EOF")
    try:
        return raw.send(data)
    except BlockingIOError:
        return 0
    except OSError as exc:
        raise _stream_error(exc) from exc


async def send_all(stream: trio.SocketStream, raw: socket.socket, data: Buffer) -> None:
    """``stream.send_all(data)``, without a scheduler pass when nothing waits."""
    with memoryview(data) as view:
        total = len(view)
        sent = send_now(stream, raw, view)
        while sent < total:
            await _wait(trio.lowlevel.wait_writable, raw)
            sent += send_now(stream, raw, view[sent:])
        if not total and raw.fileno() == -1:
            raise trio.ClosedResourceError("socket was already closed")


def receive_now(raw: socket.socket, size: int) -> bytes | None:
    """The bytes already received (empty: the peer closed), None when there are none
    yet: no wait, no scheduler pass (the caller owes one, as :func:`receive_some`)."""
    try:
        return raw.recv(size)
    except BlockingIOError:
        return None
    except OSError as exc:
        raise _stream_error(exc) from exc


async def receive_some(raw: socket.socket, max_bytes: int | None = None) -> bytes:
    """``stream.receive_some(max_bytes)`` with exactly one scheduler pass."""
    size = DEFAULT_RECEIVE_SIZE if max_bytes is None else max_bytes
    data = receive_now(raw, size)
    if data is not None:
        await trio.lowlevel.checkpoint()
        return data
    return await receive_waiting(raw, size)


async def receive_waiting(raw: socket.socket, size: int) -> bytes:
    """The next bytes once some arrive, for a caller that found none (:func:`receive_now`):
    the wait is its scheduler pass."""
    while True:
        await _wait(trio.lowlevel.wait_readable, raw)
        data = receive_now(raw, size)
        if data is not None:
            return data


def idle_and_open(raw: socket.socket) -> bool:
    """True when nothing was received on ``raw`` and its peer has not closed it (a kept
    connection still fit for a request): one peek, no poll object."""
    try:
        raw.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False  # a byte the peer sent unasked, or its close (b"")


async def _wait(wait: Callable[[socket.socket], Awaitable[None]], raw: socket.socket) -> None:
    if raw.fileno() == -1:
        raise trio.ClosedResourceError("socket was already closed")
    await wait(raw)


def _stream_error(exc: OSError) -> trio.ClosedResourceError | trio.BrokenResourceError:
    if exc.errno == errno.EBADF:
        return trio.ClosedResourceError("this socket was already closed")
    return trio.BrokenResourceError(f"socket connection broken: {exc}")
