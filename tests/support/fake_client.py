"""A fake client: HTTP/1.1 written by hand on loopback sockets.

For the tests where the client's behaviour is the subject (a body trickled byte by
byte, a slow but steady body, a connection kept open or abandoned): an HTTP library
would decide for them how fast bytes go and when a connection ends. The pauses in
:func:`trickle` and :func:`send_paced` are that client's pace, as the delays of
``fake_upstream.py`` are the upstream's.
"""

from __future__ import annotations

from typing import Any

import orjson
import trio

CHAT = "/v1/chat/completions"
PROSE = "The quick brown fox jumps over the lazy dog, again and again. "


async def connect(url: str) -> trio.SocketStream:
    """A new connection to the server at ``url`` (``http://host:port``)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return await trio.open_tcp_stream(host, int(port))


def models(url: str) -> bytes:
    """GET /v1/models, the request that needs no key."""
    host = url.removeprefix("http://")
    return f"GET /v1/models HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()


def head(url: str, length: int | None, token: str | None = None, path: str = CHAT) -> bytes:
    """A POST's request line and headers: sized, or chunked when ``length`` is None."""
    host = url.removeprefix("http://")
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", "Content-Type: application/json"]
    if token:
        lines.append(f"Authorization: Bearer {token}")
    lines.append(
        f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    )
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def chat_body(size: int = 0, **fields: Any) -> bytes:
    """A chat call whose message pads the body to about ``size`` bytes."""
    body = {"model": "gpt-4o-mini", "max_tokens": 4, "messages": [{"role": "user", "content": ""}]}
    body.update(fields)
    pad = max(0, size - len(orjson.dumps(body)))
    body["messages"][0]["content"] = (PROSE * (pad // len(PROSE) + 1))[:pad]
    return orjson.dumps(body)


def complete(data: bytes) -> bool:
    """Whether ``data`` holds a whole answer with a Content-Length."""
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False


async def exchange(stream: trio.SocketStream, request: bytes) -> bytes:
    """Send one request and read its whole answer (it ends with the body's last chunk)."""
    await stream.send_all(request)
    data = b""
    with trio.fail_after(10):
        while not (data.endswith(b"0\r\n\r\n") or complete(data)):
            chunk = await stream.receive_some(65536)
            assert chunk, f"closed mid-answer: {data!r}"
            data += chunk
    return data


async def read_answer(stream: trio.SocketStream, seconds: float = 15) -> bytes:
    """The whole answer (sized) to a request already sent, within ``seconds``."""
    data = b""
    with trio.fail_after(seconds):
        while not complete(data):
            chunk = await stream.receive_some(65536)
            assert chunk, f"closed mid-answer: {data!r}"
            data += chunk
    return data


async def early_answer(stream: trio.SocketStream, seconds: float = 15) -> bytes:
    """What the server answered before it closed a connection whose upload it did not
    read (the client's send failed): read as httpx reads it; empty when the reset came
    first and took the answer with it."""
    data = b""
    with trio.fail_after(seconds):
        try:
            while not complete(data) and (chunk := await stream.receive_some(65536)):
                data += chunk
        except trio.BrokenResourceError:
            pass
    return data if complete(data) else b""


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def error_of(answer: bytes) -> dict[str, Any]:
    return orjson.loads(answer.partition(b"\r\n\r\n")[2])["error"]


async def closed_within(stream: trio.SocketStream, seconds: float) -> float:
    """Seconds until the server closes the connection (EOF), failing past ``seconds``."""
    start = trio.current_time()
    with trio.fail_after(seconds):
        assert await stream.receive_some(1) == b""
    return trio.current_time() - start


async def trickle(stream: trio.SocketStream, every: float) -> None:
    """One byte of body every ``every`` seconds until the server stops reading."""
    try:
        while True:
            await stream.send_all(b" ")
            await trio.sleep(every)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def send_paced(stream: trio.SocketStream, data: bytes, step: int, every: float) -> None:
    """``data`` in pieces of ``step`` bytes, one every ``every`` seconds."""
    for offset in range(0, len(data), step):
        await stream.send_all(data[offset : offset + step])
        await trio.sleep(every)
