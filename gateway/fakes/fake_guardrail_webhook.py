"""A fake of the operator's guardrail service (the ``webhook`` guardrail kind): a real
HTTP/1.1 server on a loopback port that answers ``POST {"guardrail", "direction",
"texts"}`` with a verdict, and keeps what it received.

Its verdicts, by the words of the texts: ``forbidden`` denies, ``hush`` is redacted to
``***``, ``slow`` answers after 5 s (past a guardrail's timeout); anything else is
allowed.
"""

from __future__ import annotations

from typing import Any

import h11
import orjson
import trio

from gateway.fakes.fake_upstream import _send, serve_loopback


class FakeWebhook:
    def __init__(self, port: int = 0) -> None:
        self.url = ""
        #: the loopback port to listen on (0: a free one)
        self.port = port
        self.received: list[dict[str, Any]] = []

    async def serve(self, *, task_status: trio.TaskStatus[FakeWebhook]) -> None:
        def started(port: int) -> None:
            self.url = f"http://127.0.0.1:{port}/check"
            task_status.started(self)

        await serve_loopback(self._answer, started, self.port)

    async def _answer(
        self, conn: h11.Connection, stream: trio.SocketStream, request: h11.Request, raw: bytes
    ) -> bool:
        payload = orjson.loads(raw)
        self.received.append(payload)
        texts: list[str] = payload["texts"]
        answer: dict[str, Any] = {"verdict": "allow"}
        if any("slow" in text for text in texts):
            await trio.sleep(5)
        if any("forbidden" in text for text in texts):
            answer = {"verdict": "deny"}
        elif any("hush" in text for text in texts):
            answer = {"verdict": "redact", "texts": [t.replace("hush", "***") for t in texts]}
        await _send(conn, stream, 200, orjson.dumps(answer))
        return True
