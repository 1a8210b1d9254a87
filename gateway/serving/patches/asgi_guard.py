"""An ASGI wrapper that lets hypercorn finish tidying a connection after each answer.

Why: with the last body message of an answer, hypercorn (in the sending task) closes
the request's stream, which hands the app an ``http.disconnect``, and then readies the
connection for its next request and starts its keep-alive timer. The request's
connection (``quart_trio_connection.py``) is told of that disconnect by the scope's
disconnect watch (``gateway/edge/asgi.py``) and would cancel the request at once, so
the sending task was cancelled half-way: the keep-alive timer never started and an
idle kept-alive connection stayed open forever. Here a disconnect that comes with or
after the last body message is not a client gone: the request ends by itself. A client
that goes away mid-answer is still seen at once (its disconnect comes before the final
send).

Patches the meeting of hypercorn 0.18.0 (``HTTPStream.app_send`` closes the stream with
the last body message; ``H11Protocol._maybe_recycle`` hands the app its disconnect before
it readies the connection) and the watch: a wrapper around the app, since hypercorn
offers no hook.
"""

from __future__ import annotations

from collections.abc import Callable

from hypercorn.typing import (
    ASGIFramework,
    ASGIReceiveCallable,
    ASGISendCallable,
    ASGISendEvent,
    Scope,
)

from gateway.edge.asgi import disconnect_watch, set_disconnect_watch

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
}


class FinalSendGuard:
    """Wraps an ASGI app (see the module docstring)."""

    def __init__(self, app: ASGIFramework) -> None:
        self.app = app

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        watch = disconnect_watch(scope) if scope["type"] == "http" else None
        if watch is None:
            await self.app(scope, receive, send)
            return
        final_started = False

        async def guarded_send(message: ASGISendEvent) -> None:
            nonlocal final_started
            if message["type"] == "http.response.body" and not message.get("more_body"):
                final_started = True
            await send(message)

        def guarded_watch(callback: Callable[[], None]) -> None:
            def gone() -> None:
                if not final_started:
                    callback()

            watch(gone)

        set_disconnect_watch(scope, guarded_watch)
        await self.app(scope, receive, guarded_send)
