"""The Quart-Trio application: request ids, error rendering, and the routes.

Every answer carries ``X-Request-Id``; answers to admitted requests also carry the
X-RateLimit-*-Requests headers that step 3 attached to ``g``. Every refusal is a
:class:`GatewayError` rendered by :func:`gateway.errors.render`; anything else that
escapes a handler is logged and answered as a 500 in the same shape, never a traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from types import FunctionType
from typing import ParamSpec, TypeVar, cast

from quart import Response, current_app, g, request
from quart.routing import QuartRule
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, MethodNotAllowed
from werkzeug.routing import Rule

from gateway.edge import dashboard, exchange
from gateway.edge.bodies import BodyGateMiddleware, gate_of
from gateway.edge.http import current_request, new_request_id, request_globals
from gateway.edge.routes import (
    admin,
    api_document,
    cache_admin,
    embedding_calls,
    health,
    key,
    mcp,
    message_calls,
    model_calls,
    models,
    prometheus,
    subkeys,
    usage,
)
from gateway.edge.routes.mcp import MCP_PATH, mcp_refusal
from gateway.edge.routes.message_calls import MESSAGES_PATH
from gateway.errors import GatewayError, render
from gateway.serving.readiness import Phase
from gateway.serving.runtime import Runtime
from gateway.store import StoreError

log = logging.getLogger("gateway.edge.app")

# Refusals of admission itself: the spec says they carry no rate-limit headers.
_NO_RATE_HEADERS = {"invalid_api_key", "scope_denied", "invalid_tags", "missing_tags"}
# Werkzeug's HTTP errors that can reach us before a handler runs.
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}
_MESSAGES = {
    "not_found": "No such endpoint.",
    "method_not_allowed": "This method is not allowed on this path.",
}


async def _discard_body() -> bool:
    """Drop what is left of the request body before answering; False when the
    connection must close instead.

    An answer given without reading the body (a 401, 404 or 405 decided from the
    headers) otherwise leaves its bytes on a kept-alive connection, and hypercorn can
    then stall the next request on that connection (found by the fuzzing run: a 30 s
    hang of the client's next call). The bytes are read and dropped, never kept
    (gateway/edge/bodies.py); a body too large or too slow closes the connection instead.
    """
    gate = gate_of(current_request())
    return gate is None or await gate.discard()


def _allowed_methods() -> str:
    """The ``Allow`` value of a 405 (RFC 9110 requires it): the path's methods, without
    the HEAD the framework adds to GET routes (HEAD is a 405 here)."""
    adapter = current_app.create_url_adapter(request)
    if adapter is None:  # only outside a request, and this runs in one
        return ""
    try:
        adapter.match(method="-")  # no route takes it: the path's methods come back
    except MethodNotAllowed as exc:
        return ", ".join(sorted(set(exc.valid_methods or ()) - {"HEAD"}))
    except HTTPException:
        pass
    return ""


P = ParamSpec("P")
T = TypeVar("T")


class _App(QuartTrio):
    """Quart-Trio's app, the coroutine check of each handler and hook made once: Quart
    makes it for the view and every hook of every request (``ensure_async``, about 30
    function calls of each call; the method is Quart's documented point to override)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._coroutine_functions: set[FunctionType] = set()

    def ensure_async(
        self, func: Callable[P, Awaitable[T]] | Callable[P, T]
    ) -> Callable[P, Awaitable[T]]:
        if type(func) is FunctionType and func in self._coroutine_functions:
            return cast("Callable[P, Awaitable[T]]", func)
        ensured = super().ensure_async(func)
        if ensured is func and type(func) is FunctionType:
            self._coroutine_functions.add(func)
        return cast("Callable[P, Awaitable[T]]", ensured)


def create_app(runtime: Runtime, rule_mixin: type[Rule] | None = None) -> QuartTrio:
    """The app and its routes; ``rule_mixin``, when given, goes in front of Quart's URL
    rule class (the server's compiles URL builders on first use)."""
    app = _App("svc-gateway")
    if rule_mixin is not None:
        app.url_rule_class = cast("type[QuartRule]", type("Rule", (rule_mixin, QuartRule), {}))
    app.config.update(
        RUNTIME=runtime,
        # Quart cuts any answer after RESPONSE_TIMEOUT (60 s) silently; we own deadlines.
        RESPONSE_TIMEOUT=None,
        PROVIDE_AUTOMATIC_OPTIONS=False,
    )
    # bodies are read only when a handler asks, within a deadline and a shared budget
    app.asgi_app = BodyGateMiddleware(app.asgi_app, runtime.config.server)  # type: ignore[method-assign]
    # "/v1//models" is an unknown path (a JSON 404), not an HTML redirect to the merged one
    app.url_map.merge_slashes = False

    readiness = runtime.readiness

    @app.before_request
    async def _assign_request_id() -> None:
        request_globals().request_id = request_id = new_request_id()
        exchange.identified(request_id)
        current = current_request()
        if current.method == "HEAD" and current.routing_exception is None:
            # Quart answers HEAD on every GET route; the spec: any other method is a 405
            raise GatewayError("method_not_allowed", _MESSAGES["method_not_allowed"])
        if readiness.phase is Phase.STARTING and current.path not in health.PATHS:
            raise GatewayError("service_unavailable", "The gateway is starting; retry shortly.")

    @app.after_request
    async def _common_headers(response: Response) -> Response:
        if not await _discard_body():
            response.headers["Connection"] = "close"
        if response.status_code == 405:
            response.headers["Allow"] = _allowed_methods()
        globals_ = request_globals()
        request_id = getattr(globals_, "request_id", None)
        if request_id is not None:
            response.headers["X-Request-Id"] = request_id
            if current_request().path.startswith(MESSAGES_PATH):
                # the name the Anthropic SDKs read (a message's _request_id)
                response.headers["request-id"] = request_id
        exchange.identified(request_id, getattr(globals_, "key", None))
        for name, value in getattr(globals_, "rate_headers", {}).items():
            response.headers.setdefault(name, value)
        return response

    @app.errorhandler(GatewayError)
    async def _gateway_error(error: GatewayError) -> Response:
        if error.code in _NO_RATE_HEADERS:
            g.rate_headers = {}
        if error.svc is not None:
            error.svc.setdefault("request_id", getattr(g, "request_id", None))
        exchange.refused(error.code)
        anthropic = request.path.startswith(MESSAGES_PATH)
        body, status, headers = render(error, "anthropic" if anthropic else "openai")
        if request.path == MCP_PATH:
            body = mcp_refusal(error)  # a JSON-RPC error whose data is the error object
        return Response(body, status=status, headers=headers)

    @app.errorhandler(HTTPException)
    async def _http_error(error: HTTPException) -> Response:
        code = _HTTP_CODES.get(error.code or 500)
        if code is None:
            code = "invalid_request" if (error.code or 500) < 500 else "internal_error"
        message = _MESSAGES.get(code)
        return await _gateway_error(GatewayError(code, message))

    @app.errorhandler(StoreError)
    async def _store_unavailable(error: StoreError) -> Response:
        """The database cannot answer (a server that went away): refuse, never serve
        unrecorded, and say when to retry."""
        log.warning("store unavailable: %s", error)
        message = "The store is unavailable; retry shortly."
        return await _gateway_error(GatewayError("admission_unavailable", message))

    @app.errorhandler(Exception)
    async def _unexpected(error: Exception) -> Response:
        log.exception("unhandled error in a handler", exc_info=error)
        return await _gateway_error(GatewayError("internal_error"))

    for module in (
        models,
        key,
        model_calls,
        message_calls,
        mcp,
        embedding_calls,
        usage,
        subkeys,
        admin,
        cache_admin,
        api_document,
        dashboard,
        health,
        prometheus,
    ):
        module.register(app)
    return app
