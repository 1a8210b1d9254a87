"""A fake OpenAI-compatible upstream: a real HTTP/1.1 server on a loopback port.

Written on trio sockets and h11 (both already in the stack) rather than Quart, because
its faults live below HTTP: a reset before any header, a connection dropped in the
middle of a chunked body, a stall.

Faults are chosen per request by a directive in the last message's text, so concurrent
tests never share state::

    [[fault status=500]]          answer with that status and an OpenAI error body
    [[fault status=429]]
    [[fault reset]]               close the connection before any header
    [[fault delay=2.5]]           wait before answering
    [[fault drop_after=2]]        stream 2 chunks, then cut the connection
    [[fault stall_after=1]]       stream 1 chunk, then hang until the client leaves
    [[fault no_usage]]            report no usage
    [[fault chunk_delay=0.2]]     pause between stream chunks
    [[fault usage_on_error]]      an error body that reports usage
    [[fault status=401 echo=X]]   the error message echoes X (``echo=auth``: the token of
                                  the Authorization received), as upstreams echo a rejected key
    [[fault drop_at_end]]         stream every chunk and the usage, then cut before [DONE]
    [[fault malformed]]           answer 200 with a body that is not JSON
    [[fault usage_with_finish]]   stream the usage in the finish_reason chunk, not after it
    [[fault usage_with_content]]  the last word, finish_reason and usage in one chunk
    [[fault hold]]                hold the call open (before answering) until ``release``;
                                  a held call whose client closes the connection ends there
    [[fault lockstep]]            stream: after each word, wait until the test ``ack()``s it
    [[fault cached=N]]            report N of the prompt tokens as read from the prompt
                                  cache (``prompt_tokens_details.cached_tokens``, as OpenAI)
    [[fault cache_write=N]]       report N prompt tokens written to the cache
                                  (``prompt_tokens_details.cache_write_tokens``, as
                                  OpenRouter); both streamed and not
    [[fault status=429 retry_after=N]]  the error answer carries ``Retry-After: N``

A fault may also stand for every request of one upstream (``standing``, the same
directive text): two upstreams behind one model then behave differently for the same
request (routing tests).

``calls`` counts requests received, ``served`` the answers sent in full, ``open`` the
calls in progress, ``abandoned`` the held calls whose client closed the connection;
``bodies``, ``auth`` and ``headers`` keep what came in.
:meth:`wait_until` waits (on events, not sleeps) until a condition on these holds.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import h11
import orjson
import trio

WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")
_DIRECTIVE = re.compile(r"\[\[fault ([^\]]*)\]\]")
ERROR_TEXT = "upstream says no: see https://internal.example/v1/x key sk-abcdefgh12345678"


def directives(body: dict[str, Any]) -> dict[str, str]:
    found: dict[str, str] = {}
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, list):
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        for match in _DIRECTIVE.finditer(content or ""):
            for item in match.group(1).split():
                name, _, value = item.partition("=")
                found[name] = value
    return found


def prompt_tokens(body: dict[str, Any]) -> int:
    """Words of the messages: always at most the gateway's byte-based estimate."""
    text = orjson.dumps(body.get("messages") or []).decode()
    return max(1, len(text.split()))


@dataclass
class FakeUpstream:
    url: str = ""
    #: the loopback port to listen on (0: a free one)
    port: int = 0
    calls: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    auth: list[str | None] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    served: int = 0
    open: int = 0
    #: held calls ([[fault hold]]) whose client closed the connection before the answer
    abandoned: int = 0
    #: held calls ([[fault hold]]) answer once this is set
    release: trio.Event = field(default_factory=trio.Event)
    _changed: trio.Event = field(default_factory=trio.Event)
    #: lockstep streams: words sent so far, and words the client said it received
    words_sent: int = 0
    acks: int = 0
    _acked: trio.Event = field(default_factory=trio.Event)
    #: the most words an answer has (one stream chunk each), whatever max_tokens allows
    max_words: int = 6
    #: directives applied to every request (``"status=500"``), under the request's own
    standing: str = ""
    #: the answer's text as these pieces (one stream chunk each), instead of the words
    reply: list[str] | None = None

    async def received(self, count: int) -> None:
        """Return once ``count`` requests in all have come in (counted, not answered)."""
        await self.wait_until(lambda: self.calls >= count)

    def ack(self) -> int:
        """(lockstep) The client received one more word; how many had been sent then."""
        self.acks += 1
        self._acked.set()
        self._acked = trio.Event()
        return self.words_sent

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_until(self, condition: Callable[[], bool]) -> None:
        """Return once ``condition()`` holds; it is checked on every call and answer."""
        while not condition():
            await self._changed.wait()

    async def serve(self, *, task_status: trio.TaskStatus[FakeUpstream]) -> None:
        def started(port: int) -> None:
            self.url = f"http://127.0.0.1:{port}/v1"
            task_status.started(self)

        await serve_loopback(self._answer, started, self.port)

    async def _answer(
        self, conn: h11.Connection, stream: trio.SocketStream, request: h11.Request, raw: bytes
    ) -> bool:
        self.calls += 1
        self.open += 1
        self._notify()
        try:
            keep = await self._reply(conn, stream, request, raw)
        finally:
            self.open -= 1
            self._notify()
        if conn.our_state is h11.DONE:
            self.served += 1
            self._notify()
        return keep

    async def _reply(
        self, conn: h11.Connection, stream: trio.SocketStream, request: h11.Request, raw: bytes
    ) -> bool:
        body = orjson.loads(raw) if raw else {}
        self.bodies.append(body)
        headers = dict(request.headers)
        self.auth.append(headers.get(b"authorization", b"").decode() or None)
        self.headers.append({k.decode(): v.decode() for k, v in headers.items()})
        standing = [{"content": f"[[fault {self.standing}]]"}] if self.standing else []
        faults = directives({"messages": standing})
        faults.update(directives(body))
        if "delay" in faults:
            await trio.sleep(float(faults["delay"]))
        if "hold" in faults and not await self._held(conn, stream):
            self.abandoned += 1
            return False
        if "reset" in faults:
            return False
        if "status" in faults:
            message = ERROR_TEXT
            if "echo" in faults:
                echoed = faults["echo"]
                if echoed == "auth":
                    echoed = self.presented_key(self.headers[-1])
                message = f"Incorrect API key provided: {echoed}. Header was {echoed!r}."
            error: dict[str, Any] = {"error": {"message": message, "type": "x", "code": None}}
            if "usage_on_error" in faults:
                error["usage"] = {"prompt_tokens": 5, "completion_tokens": 3}
            extra = (("retry-after", faults["retry_after"]),) if "retry_after" in faults else ()
            await _send(conn, stream, int(faults["status"]), orjson.dumps(error), extra)
            return True
        if "malformed" in faults:
            await _send(conn, stream, 200, b"<html>upstream proxy page</html>")
            return True
        path = request.target.decode().partition("?")[0]
        if path.endswith("/embeddings"):
            return await self._embeddings(conn, stream, body)
        if body.get("stream"):
            return await self._stream(conn, stream, body, faults)
        content, usage = _reply(body, faults, self.max_words)
        if self.reply is not None:
            content = "".join(self.reply)
        completion = self.decorate(_completion(body, content, usage, "chat.completion"))
        await _send(conn, stream, 200, orjson.dumps(completion))
        return True

    def presented_key(self, headers: dict[str, str]) -> str:
        """The key a request presented (OpenAI's: the Bearer token)."""
        return headers.get("authorization", "").removeprefix("Bearer ")

    def decorate(self, answer: dict[str, Any]) -> dict[str, Any]:
        """An answer or stream chunk as this upstream sends it (OpenAI's: as it is)."""
        return answer

    def first_chunks(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """Chunks a stream sends before its first choice (OpenAI's: none)."""
        return []

    async def _chunk(
        self, conn: h11.Connection, stream: trio.SocketStream, chunk: dict[str, Any]
    ) -> None:
        await _event(conn, stream, self.decorate(chunk))

    async def _held(self, conn: h11.Connection, stream: trio.SocketStream) -> bool:
        """Wait for ``release`` while watching the connection: False when the client
        closed it first (a gateway that cut the call)."""
        left = False
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                nonlocal left
                try:
                    while data := await stream.receive_some(65536):
                        conn.receive_data(data)  # (a next request: h11 keeps it)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                left = True
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            await self.release.wait()
            nursery.cancel_scope.cancel()
        return not left

    async def _stream(
        self,
        conn: h11.Connection,
        stream: trio.SocketStream,
        body: dict[str, Any],
        faults: dict[str, str],
    ) -> bool:
        content, usage = _reply(body, faults, self.max_words)
        head = h11.Response(
            status_code=200,
            headers=[("content-type", "text/event-stream"), ("transfer-encoding", "chunked")],
        )
        await stream.send_all(conn.send(head))
        for chunk in self.first_chunks(body):
            await _event(conn, stream, chunk)
        words = [(" " if i else "") + word for i, word in enumerate(content.split())]
        pieces = [{"role": "assistant", "content": ""}] + [
            {"content": piece} for piece in (self.reply if self.reply is not None else words)
        ]
        delay = float(faults.get("chunk_delay", 0))
        last: dict[str, Any] = {}
        if "usage_with_content" in faults:
            last = {"index": 0, "delta": pieces.pop(), "finish_reason": "stop"}
        for index, delta in enumerate(pieces):
            if "drop_after" in faults and index >= int(faults["drop_after"]):
                return False  # cut: no terminating chunk
            if "stall_after" in faults and index >= int(faults["stall_after"]):
                await trio.sleep_forever()
            choice = {"index": 0, "delta": delta, "finish_reason": None}
            self.words_sent = index
            await self._chunk(
                conn, stream, _completion(body, None, None, "chat.completion.chunk", choice)
            )
            while "lockstep" in faults and self.acks < index:
                await self._acked.wait()
            if delay:
                await trio.sleep(delay)
        final = {"index": 0, "delta": {}, "finish_reason": "stop"}
        if "usage_with_content" in faults:
            await self._chunk(
                conn, stream, _completion(body, None, usage, "chat.completion.chunk", last)
            )
            usage = None
        elif "usage_with_finish" in faults:
            chunk = _completion(body, None, usage, "chat.completion.chunk", final)
            await self._chunk(conn, stream, chunk)
            usage = None
        else:
            await self._chunk(
                conn, stream, _completion(body, None, None, "chat.completion.chunk", final)
            )
        if usage is not None:
            chunk = _completion(body, None, usage, "chat.completion.chunk")
            chunk["choices"] = []
            await self._chunk(conn, stream, chunk)
        if "drop_at_end" in faults:
            return False  # cut: usage reported, no [DONE], no terminating chunk
        await stream.send_all(conn.send(h11.Data(data=b"data: [DONE]\n\n")))
        await stream.send_all(conn.send(h11.EndOfMessage()))
        return True

    async def _embeddings(
        self, conn: h11.Connection, stream: trio.SocketStream, body: dict[str, Any]
    ) -> bool:
        inputs = body.get("input")
        inputs = [inputs] if isinstance(inputs, str) else list(inputs or [])
        size = int(body.get("dimensions") or 4)
        data = [
            {"object": "embedding", "index": i, "embedding": [1.0] + [0.0] * (size - 1)}
            for i in range(len(inputs))
        ]
        tokens = sum(len(str(item).split()) for item in inputs)
        answer = {
            "object": "list",
            "data": data,
            "model": body.get("model"),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        await _send(conn, stream, 200, orjson.dumps(answer))
        return True


def _reply(
    body: dict[str, Any], faults: dict[str, str], max_words: int
) -> tuple[str, dict[str, Any] | None]:
    limit = int(body.get("max_tokens") or 16)
    words = [WORDS[i % len(WORDS)] for i in range(min(limit, max_words))]
    content = " ".join(words)
    if "no_usage" in faults:
        return content, None
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens(body),
        "completion_tokens": len(words),
        "total_tokens": prompt_tokens(body) + len(words),
    }
    if "cached" in faults or "cache_write" in faults:
        usage["prompt_tokens_details"] = {"cached_tokens": int(faults.get("cached", 0))}
        if "cache_write" in faults:
            usage["prompt_tokens_details"]["cache_write_tokens"] = int(faults["cache_write"])
    return content, usage


def _completion(
    body: dict[str, Any],
    content: str | None,
    usage: dict[str, Any] | None,
    kind: str,
    choice: dict[str, Any] | None = None,
) -> dict[str, Any]:
    if choice is None and kind == "chat.completion":
        message = {"role": "assistant", "content": content}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
    answer: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": kind,
        "created": 1_700_000_000,
        "model": body.get("model", "fake"),
        "choices": [choice] if choice else [],
    }
    if usage is not None:
        answer["usage"] = usage
    return answer


#: answers one request (connection, stream, request, body); False: close the connection
Answer = Callable[[h11.Connection, trio.SocketStream, h11.Request, bytes], Awaitable[bool]]


async def serve_loopback(answer: Answer, started: Callable[[int], None], port: int = 0) -> None:
    """Serve on a loopback port (0: a free one; ``started`` is told which), each
    connection's requests answered in turn by ``answer``."""
    listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
    started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(partial(serve_connection, answer=answer), listeners)


async def serve_connection(stream: trio.SocketStream, answer: Answer) -> None:
    """Answer the requests of one connection in turn until ``answer`` says to stop
    (False: close it) or the client closes it."""
    conn = h11.Connection(h11.SERVER)
    try:
        while True:
            request, body = await _read_request(conn, stream)
            if request is None:
                return
            keep = await answer(conn, stream, request, body)
            if not keep or conn.our_state is not h11.DONE:
                return
            conn.start_next_cycle()
    except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
        return
    finally:
        await stream.aclose()


async def _read_request(
    conn: h11.Connection, stream: trio.SocketStream
) -> tuple[h11.Request | None, bytes]:
    request: h11.Request | None = None
    body = b""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(65536)
            conn.receive_data(data)
            if not data and request is None:
                return None, b""
            continue
        if isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return request, body
        elif isinstance(event, h11.ConnectionClosed):
            return None, b""


async def _send(
    conn: h11.Connection,
    stream: trio.SocketStream,
    status: int,
    data: bytes,
    extra: tuple[tuple[str, str], ...] = (),
) -> None:
    headers = [("content-type", "application/json"), ("content-length", str(len(data)))]
    headers += extra
    await stream.send_all(conn.send(h11.Response(status_code=status, headers=headers)))
    await stream.send_all(conn.send(h11.Data(data=data)))
    await stream.send_all(conn.send(h11.EndOfMessage()))


async def _event(conn: h11.Connection, stream: trio.SocketStream, chunk: dict[str, Any]) -> None:
    await stream.send_all(conn.send(h11.Data(data=b"data: " + orjson.dumps(chunk) + b"\n\n")))
