"""GET /metrics: the Prometheus text exposition of this server's registry.

No key, unless ``[server] metrics_token`` is set: then ``Authorization: Bearer <token>``,
compared in constant time; a wrong or missing token is the uniform 401. With
``[server] metrics = false`` the path does not exist (404).
"""

from __future__ import annotations

import hmac

from quart import Quart, Response

from gateway.edge.auth import bearer_token
from gateway.edge.http import runtime
from gateway.errors import GatewayError
from gateway.observe.metrics import CONTENT_TYPE


async def metrics() -> Response:
    rt = runtime()
    if not rt.config.server.metrics:
        raise GatewayError("not_found", "No such endpoint.")
    expected = rt.config.server.metrics_token
    if expected is not None:
        given = bearer_token() or ""
        if not hmac.compare_digest(given.encode(), expected.encode()):
            raise GatewayError("invalid_api_key", "The metrics token is missing or wrong.")
    return Response(rt.metrics.exposition(), 200, content_type=CONTENT_TYPE)


def register(app: Quart) -> None:
    app.add_url_rule("/metrics", "metrics", metrics, methods=["GET"])
