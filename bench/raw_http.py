"""A minimal keep-alive HTTP/1.1 client for the benches' load phases.

The load of ``bench/live_upstream.py`` runs on the core the gateway does not have, beside
the fake upstream. httpx spends about as much CPU per call as the gateway under test
once the gateway is lean, so with httpx the load side, not the gateway, set the calls/s
of the 16-caller phases. This client does the least a client can: one connection per
caller, the request's bytes written once, the answer's head parsed with ``split``, the
body read by ``Content-Length`` or de-chunked. Both sides of ``--against`` get the same
client.
"""

from __future__ import annotations

import trio


class RawConnection:
    """One kept-alive connection to ``host:port``; requests go one at a time."""

    def __init__(self, host: str, port: int, headers: dict[str, str]) -> None:
        self.host, self.port = host, port
        self._fixed = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        self._stream: trio.SocketStream | None = None
        self._buffer = bytearray()

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """``POST path`` with ``body``: the status and the whole (de-chunked) body."""
        if self._stream is None:
            self._stream = await trio.open_tcp_stream(self.host, self.port)
            self._buffer.clear()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n{self._fixed}"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        await self._stream.send_all(head.encode("ascii") + body)
        status, headers = await self._head()
        if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            answer = await self._chunked()
        else:
            answer = await self._exactly(int(headers.get(b"content-length", b"0")))
        if headers.get(b"connection", b"").lower() == b"close":
            await self.aclose()
        return status, answer

    async def aclose(self) -> None:
        if self._stream is not None:
            await self._stream.aclose()
            self._stream = None

    async def _fill(self) -> None:
        assert self._stream is not None
        data = await self._stream.receive_some(65536)
        if not data:
            raise ConnectionError("the server closed the connection mid-answer")
        self._buffer += data

    async def _line(self) -> bytes:
        while (end := self._buffer.find(b"\r\n")) < 0:
            await self._fill()
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 2]
        return line

    async def _exactly(self, size: int) -> bytes:
        while len(self._buffer) < size:
            await self._fill()
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    async def _head(self) -> tuple[int, dict[bytes, bytes]]:
        while (end := self._buffer.find(b"\r\n\r\n")) < 0:
            await self._fill()
        lines = bytes(self._buffer[:end]).split(b"\r\n")
        del self._buffer[: end + 4]
        status = int(lines[0].split(b" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        return status, headers

    async def _chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            size = int((await self._line()).split(b";", 1)[0], 16)
            if size == 0:
                while await self._line():  # trailers, up to the empty line
                    pass
                return b"".join(parts)
            parts.append(await self._exactly(size))
            await self._exactly(2)  # the CRLF after each chunk
