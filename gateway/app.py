"""The Quart-Trio application: request ids, error rendering, and the routes.

Every answer carries ``X-Request-Id``; answers to admitted requests also carry the
X-RateLimit-*-Requests headers that step 3 attached to ``g``. Every refusal is a
:class:`GatewayError` rendered by :func:`gateway.errors.render`; anything else that
escapes a handler is logged and answered as a 500 in the same shape, never a traceback.
"""

from __future__ import annotations

import logging

from quart import Response, g, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from gateway import dashboard
from gateway.errors import GatewayError, render
from gateway.http import new_request_id
from gateway.routes import admin, chat, embeddings, key, models, openapi, subkeys, usage
from gateway.runtime import Runtime
from gateway.store import StoreError

log = logging.getLogger("gateway.app")

# Refusals of admission itself: the spec says they carry no rate-limit headers.
_NO_RATE_HEADERS = {"invalid_api_key", "scope_denied", "invalid_tags", "missing_tags"}
# Werkzeug's HTTP errors that can reach us before a handler runs.
_HTTP_CODES = {
    404: "not_found",
    405: "method_not_allowed",
    408: "invalid_request",  # the body did not arrive within the call's time limit
    413: "request_too_large",
}
_MESSAGES = {
    "not_found": "No such endpoint.",
    "method_not_allowed": "This method is not allowed on this path.",
}
_HTTP_MESSAGES = {408: "The request body did not arrive in time."}


async def _drain_body() -> bool:
    """Read what is left of the request body before answering; False when it is too large.

    An answer given without reading the body (a 401, 404 or 405 decided from the
    headers) otherwise leaves its bytes on a kept-alive connection, and hypercorn can
    then stall the next request on that connection (found by the fuzzing run: a 30 s
    hang of the client's next call). A body over the limit is not read: its answer
    closes the connection instead.
    """
    try:
        await request.get_data(cache=True)
    except HTTPException:
        return False
    return True


def create_app(runtime: Runtime) -> QuartTrio:
    app = QuartTrio("svc-gateway")
    app.config.update(
        RUNTIME=runtime,
        MAX_CONTENT_LENGTH=runtime.config.server.max_body_bytes,
        # Quart cuts any answer after RESPONSE_TIMEOUT (60 s) silently; we own deadlines.
        RESPONSE_TIMEOUT=None,
        # A body still arriving when a call would have timed out is refused (400, and the
        # connection closed): a client cannot hold a connection open by never finishing.
        BODY_TIMEOUT=runtime.config.server.request_timeout_s,
        PROVIDE_AUTOMATIC_OPTIONS=False,
    )
    # "/v1//models" is an unknown path (a JSON 404), not an HTML redirect to the merged one
    app.url_map.merge_slashes = False

    @app.before_request
    async def _assign_request_id() -> None:
        g.request_id = new_request_id()
        if request.method == "HEAD" and request.routing_exception is None:
            # Quart answers HEAD on every GET route; the spec: any other method is a 405
            raise GatewayError("method_not_allowed", _MESSAGES["method_not_allowed"])

    @app.after_request
    async def _common_headers(response: Response) -> Response:
        if not await _drain_body():
            response.headers["Connection"] = "close"
        request_id = getattr(g, "request_id", None)
        if request_id is not None:
            response.headers["X-Request-Id"] = request_id
        for name, value in getattr(g, "rate_headers", {}).items():
            response.headers.setdefault(name, value)
        return response

    @app.errorhandler(GatewayError)
    async def _gateway_error(error: GatewayError) -> Response:
        if error.code in _NO_RATE_HEADERS:
            g.rate_headers = {}
        if error.svc is not None:
            error.svc.setdefault("request_id", getattr(g, "request_id", None))
        body, status, headers = render(error)
        return Response(body, status=status, headers=headers)

    @app.errorhandler(HTTPException)
    async def _http_error(error: HTTPException) -> Response:
        code = _HTTP_CODES.get(error.code or 500)
        if code is None:
            code = "invalid_request" if (error.code or 500) < 500 else "internal_error"
        message = _HTTP_MESSAGES.get(error.code or 500) or _MESSAGES.get(code)
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

    for module in (models, key, chat, embeddings, usage, subkeys, admin, openapi, dashboard):
        module.register(app)
    return app
