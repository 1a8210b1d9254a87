"""Quart-Trio's HTTP connection with one task fewer per request.

Patches Quart-Trio 0.12.0's ``TrioASGIHTTPConnection.__call__``, which spawns two tasks
per request (one reads the client's messages, one handles the request) and waits for
both: here the request is handled in the connection's own task, beside the task that
watches for the client's disconnect (which cancels it, as before). Installed on the app
through Quart's ``asgi_http_class`` (:func:`install`), so ``gateway/edge/`` builds a plain
Quart-Trio app.
"""

from __future__ import annotations

import trio
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable
from quart_trio import QuartTrio
from quart_trio.asgi import TrioASGIHTTPConnection

#: the upstream code this module was reviewed against (see gateway/serving/patches/):
#: qualified name → (version, SHA-256 of its source)
REVIEWED: dict[str, tuple[str, str]] = {
    # replaced by HTTPConnection.__call__
    "quart_trio.asgi.TrioASGIHTTPConnection.__call__": (
        "0.12.0",
        "98802020652fd68be29f99020c04c4c22d1f6d6ca2907e3cb2b68e40cdaf037e",
    ),
    # called as __call__ calls them: each cancels the nursery when it is done
    "quart_trio.asgi.TrioASGIHTTPConnection.handle_messages": (
        "0.12.0",
        "8d994a7d28dcac9d62dc483b2678e46b96529faa4d0e0d550b2daec36e56a1df",
    ),
    "quart_trio.asgi.TrioASGIHTTPConnection.handle_request": (
        "0.12.0",
        "93e58fe22209877b5739e23da890507e045e039bd6daf651e29802f1dd8f137f",
    ),
}


class HTTPConnection(TrioASGIHTTPConnection):
    """Quart-Trio 0.12.0's HTTP connection, the request handled in the calling task."""

    async def __call__(self, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        request = self._create_request_from_scope(send)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.handle_messages, nursery, request, receive)
            await self.handle_request(nursery, request, send)


def install(app: QuartTrio) -> None:
    """Serve ``app``'s HTTP requests through :class:`HTTPConnection`."""
    app.asgi_http_class = HTTPConnection
