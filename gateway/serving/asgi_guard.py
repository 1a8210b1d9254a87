"""An ASGI wrapper that lets hypercorn finish tidying a connection after each answer.

Why: with the last body message of an answer, hypercorn (in the sending task) closes
the request's stream, which hands the app an ``http.disconnect``, and then readies the
connection for its next request and starts its keep-alive timer. Quart-Trio reads that
disconnect in a sibling task and cancels the request's nursery at once, so the sending
task was cancelled half-way: the keep-alive timer never started and an idle kept-alive
connection stayed open forever. Here an ``http.disconnect`` that arrives while the last
body message is being sent is handed over only once that send has returned. A client
that goes away mid-answer is still seen at once (its disconnect does not come during
the final send).
"""

from __future__ import annotations

import trio
from hypercorn.typing import (
    ASGIFramework,
    ASGIReceiveCallable,
    ASGIReceiveEvent,
    ASGISendCallable,
    ASGISendEvent,
    Scope,
)


class FinalSendGuard:
    """Wraps an ASGI app (see the module docstring)."""

    def __init__(self, app: ASGIFramework) -> None:
        self.app = app

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        final_sent = trio.Event()
        final_sending = False

        async def guarded_send(message: ASGISendEvent) -> None:
            nonlocal final_sending
            final = message["type"] == "http.response.body" and not message.get("more_body")
            if not final:
                await send(message)
                return
            final_sending = True
            try:
                await send(message)
            finally:
                final_sending = False
                final_sent.set()

        async def guarded_receive() -> ASGIReceiveEvent:
            message = await receive()
            if message["type"] == "http.disconnect" and final_sending:
                await final_sent.wait()
            return message

        await self.app(scope, guarded_receive, guarded_send)
