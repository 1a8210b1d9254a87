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
