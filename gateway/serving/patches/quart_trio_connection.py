"""Quart-Trio's HTTP connection without a task per request.

Patches Quart-Trio 0.12.0's ``TrioASGIHTTPConnection.__call__``, which spawns two tasks
per request (one reads the client's messages, one handles the request) and waits for
both. Here the request is handled in the server's task for it, and the client's
disconnect cancels it through the scope's ``DISCONNECT_WATCH`` (``gateway/edge/asgi.py``,
offered by ``hypercorn_worker.py``), a callback, instead of a task reading messages until
the disconnect. The request's body reaches the handlers through ``gateway.edge.bodies``
(the gate), never through Quart's ``request.body``, which is complete and empty from the
start. Installed on the app through Quart's ``asgi_http_class`` (:func:`install`), so
``gateway/edge/`` builds a plain Quart-Trio app.
"""

from __future__ import annotations

from typing import Any, cast

import trio
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, HTTPResponseStartEvent
from quart_trio import QuartTrio
from quart_trio.asgi import TrioASGIHTTPConnection

from gateway.calls.streaming import StreamBody
from gateway.edge.asgi import BODY_FOLLOWS, disconnect_watch

#: the upstream code this module was reviewed against (see gateway/serving/patches/):
#: qualified name → (version, SHA-256 of its source)
REVIEWED: dict[str, tuple[str, str]] = {
    # replaced by HTTPConnection.__call__
    "quart_trio.asgi.TrioASGIHTTPConnection.__call__": (
        "0.12.0",
        "98802020652fd68be29f99020c04c4c22d1f6d6ca2907e3cb2b68e40cdaf037e",
    ),
    # replaced too (its nursery gone): the request's body is not read, its disconnect
    # comes through the watch
    "quart_trio.asgi.TrioASGIHTTPConnection.handle_messages": (
        "0.12.0",
        "8d994a7d28dcac9d62dc483b2678e46b96529faa4d0e0d550b2daec36e56a1df",
    ),
    # _send_response's headers as its encode_headers writes them
    "quart.utils.encode_headers": (
        "0.22.0",
        "43f0b0391d7254e780de914444f8519cedaffb6876e08978a21b4f8a5b5ca45f",
    ),
    # called by __call__ as Quart-Trio's connection calls them: the request built from
    # the scope (its body left to the gate), the answer sent through ``send``
    "quart.asgi.ASGIHTTPConnection._create_request_from_scope": (
        "0.22.0",
        "3476af7fd451af2809271eaac94a8592be541e6ea6bf6438f9da20a184f29aed",
    ),
    "quart.asgi.ASGIHTTPConnection._send_response": (
        "0.22.0",
        "2958216ed9d8d2ebf66be8a3fbcf2a2cb50a2e89a77b196a1f919e834f7c49c7",
    ),
    # HTTPConnection._send_response sends a DataBody's bytes as its iterator yields them
    # (data[begin:end], once) and its start as Quart's does
    "quart.wrappers.response.DataBody": (
        "0.22.0",
        "a0ec2d37126227306b77656ffd08f4b51b33af5d24d78e44bee78fc409f6b1f3",
    ),
    # its ``iter``: the StreamBody given to the Response (an async iterator is its own)
    "quart.wrappers.response.IterableBody": (
        "0.22.0",
        "6000c4eb1baca62281f8a192d253a6042948d885086796b140529dbd06d16c26",
    ),
    "quart.wrappers.response._DataBodyGen": (
        "0.22.0",
        "850bd3d77ab655419aba26749a005e8f83058a25d16101b2bf58a9c1edee7731",
    ),
    # copied into __call__, without the nursery it cancels
    "quart_trio.asgi.TrioASGIHTTPConnection.handle_request": (
        "0.12.0",
        "93e58fe22209877b5739e23da890507e045e039bd6daf651e29802f1dd8f137f",
    ),
}


class HTTPConnection(TrioASGIHTTPConnection):
    """Quart-Trio 0.12.0's HTTP connection, the request handled in the calling task."""

    async def __call__(self, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        request = self._create_request_from_scope(send)
        watch = disconnect_watch(self.scope)
        assert watch is not None, "served by gateway.serving.patches.hypercorn_worker"
        request.body.set_complete()
        with trio.CancelScope() as scope:
            watch(scope.cancel)
            # TrioASGIHTTPConnection.handle_request without its nursery
            response = await self.app.handle_request(request)
            # Quart's Response has a timeout (Ellipsis: the app's); werkzeug's has none
            timeout = getattr(response, "timeout", Ellipsis)
            if timeout is Ellipsis:
                timeout = self.app.config["RESPONSE_TIMEOUT"]
            if timeout is None:
                await self._send_response(send, response)
            else:
                with trio.move_on_after(timeout):
                    await self._send_response(send, response)

    async def _send_response(self, send: ASGISendCallable, response: Any) -> None:
        # Quart's Response names its body classes (quart is the edge's to import)
        body: Any = getattr(response, "response", None)
        whole = type(body) is getattr(response, "data_body_class", None)
        stream = (
            type(body) is getattr(response, "iterable_body_class", None)
            and type(body.iter) is StreamBody
        )
        if not (whole or stream):
            await super()._send_response(send, response)
            return
        start = {
            "type": "http.response.start",
            "status": response.status_code,
            "headers": [(k.lower().encode(), v.encode()) for k, v in response.headers.items()],
            BODY_FOLLOWS: True,
        }
        await send(cast(HTTPResponseStartEvent, start))  # a start with an extension key
        if stream:
            await body.iter.write_to(send)
            return
        data = body.data[body.begin : body.end]
        await send({"type": "http.response.body", "body": data, "more_body": False})


def install(app: QuartTrio) -> None:
    """Serve ``app``'s HTTP requests through :class:`HTTPConnection`."""
    app.asgi_http_class = HTTPConnection
