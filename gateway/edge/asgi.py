"""ASGI 3.0 as the edge's wrappers see it: a scope and messages are string-keyed
dictionaries, and an app is ``app(scope, receive, send)``.

The edge's wrappers (``exchange.ExchangeRecorder``, ``bodies.BodyGateMiddleware``) are
typed with these rather than the server's own TypedDicts, so that nothing outside
``serving/`` imports hypercorn; ``serving/server.py`` hands the wrapped app to hypercorn.
A wrapper adds its own keys to the scope (``svc.exchange``, ``svc.body_gate``), which
ASGI allows and hypercorn's TypedDicts do not declare.

A scope and a message are ``Any``: a wrapper sits between hypercorn and Quart, whose
types are hypercorn's TypedDict unions, and must be callable as either's; it reads only
the few keys ASGI guarantees for the message types it checks first.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

Scope = Any
Message = Any
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

#: the scope extension (``scope["extensions"][DISCONNECT_WATCH]``) through which the
#: server tells the app that its client has gone, instead of a task per request waiting
#: for the ``http.disconnect`` message: a :data:`Watch`. Set by the server
#: (``gateway/serving/patches/hypercorn_worker.py``); a wrapper that holds back or
#: consumes the disconnect (``bodies.BodyGateMiddleware``) puts its own watch in its
#: place for the app it wraps (the server's own calls no watch once the answer's last
#: body message has begun: that disconnect is the answer's end, not a client gone);
#: Quart-Trio's connection (``gateway/serving/patches/quart_trio_connection.py``)
#: cancels the request with it.
DISCONNECT_WATCH = "svc.disconnect_watch"
#: ``watch(callback)``: ``callback()`` once, when the client has gone (at once if it has)
Watch = Callable[[Callable[[], None]], None]


def disconnect_watch(scope: Scope) -> Watch | None:
    """The request's :data:`Watch`; None when the server offers none."""
    watch: Watch | None = scope.get("extensions", {}).get(DISCONNECT_WATCH)
    return watch


def set_disconnect_watch(scope: Scope, watch: Watch) -> None:
    """Offer ``watch`` to the app that gets ``scope``."""
    scope["extensions"][DISCONNECT_WATCH] = watch


#: the scope extension (``scope["extensions"][RECEIVE_NOW]``) through which the server
#: hands over the request's next message if it has arrived already, else None: no wait,
#: no scheduler pass (a reader under a deadline needs the deadline's scope, ~50 function
#: calls, only to wait). Set by the server beside :data:`DISCONNECT_WATCH`; it takes from
#: the same queue as the ``receive`` the app is given.
RECEIVE_NOW = "svc.receive_now"
ReceiveNow = Callable[[], Message | None]


def receive_now(scope: Scope) -> ReceiveNow | None:
    """The request's :data:`ReceiveNow`; None when the server offers none."""
    taker: ReceiveNow | None = scope.get("extensions", {}).get(RECEIVE_NOW)
    return taker


def set_receive_now(scope: Scope, taker: ReceiveNow) -> None:
    """Offer ``taker`` to the app that gets ``scope``."""
    scope["extensions"][RECEIVE_NOW] = taker


#: a key of an ``http.response.start`` message (``message[BODY_FOLLOWS] = True``): the
#: answer's first body message follows at once, so the server may hold the head and
#: write both together (one system call, one packet). Set by Quart-Trio's connection
#: (``gateway/serving/patches/quart_trio_connection.py``) for an answer whose body it
#: has whole; honoured by ``gateway/serving/patches/hypercorn_worker.py``.
BODY_FOLLOWS = "svc.body_follows"
