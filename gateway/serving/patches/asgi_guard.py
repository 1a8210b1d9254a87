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

Patches the meeting of hypercorn 0.18.0 (``HTTPStream.app_send`` closes the stream with
the last body message; ``H11Protocol._maybe_recycle`` hands the app its disconnect before
it readies the connection) and Quart-Trio 0.12.0 over Quart 0.22.0 (the request's
nursery is cancelled as soon as ``handle_messages`` reads that disconnect): a wrapper
around the app, since neither side offers a hook.
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

#: the upstream code this module was reviewed against (see gateway/serving/patches/):
#: qualified name → (version, SHA-256 of its source)
REVIEWED: dict[str, tuple[str, str]] = {
    # the final body message is followed by StreamClosed, in the sending task
    "hypercorn.protocol.http_stream.HTTPStream.app_send": (
        "0.18.0",
        "c806044b997369855904b5496ef44bd2bf273f599e686647500ce507c1b0250b",
    ),
    # the disconnect first (_close_stream), then the next cycle and the idle timer
    "hypercorn.protocol.h11.H11Protocol._maybe_recycle": (
        "0.18.0",
        "3ac53f52bc4e65de7e9b898df5c1c76c9865479e2821ed524acdf426c2075a88",
    ),
    # reads until the disconnect, then cancels the request's nursery
    "quart.asgi.ASGIHTTPConnection.handle_messages": (
        "0.22.0",
        "c69dd49dbf636109e9f22d5970782611bff650f840d3bfb24c2ec11c3b913ee6",
    ),
    "quart_trio.asgi.TrioASGIHTTPConnection.handle_messages": (
        "0.12.0",
        "8d994a7d28dcac9d62dc483b2678e46b96529faa4d0e0d550b2daec36e56a1df",
    ),
}


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
