"""GET /v1/models: the public catalog without a key, the organisation's catalog with one."""

from __future__ import annotations

import orjson
from quart import Quart, Response, request

from gateway.auth import admit_reader
from gateway.http import json_response, runtime
from gateway.policy import callable_models

PUBLIC_CACHE_SECONDS = 300


async def list_models() -> Response:
    rt = runtime()
    if "Authorization" not in request.headers:
        return _public()
    record = await admit_reader(rt, "inference")
    return json_response(rt.catalog.listing(callable_models(rt, record)))


def _public() -> Response:
    rt = runtime()
    verdict = rt.public_limiter.hit(request.remote_addr or "unknown")
    headers = {
        "X-RateLimit-Limit": str(verdict.limit),
        "X-RateLimit-Remaining": str(verdict.remaining),
    }
    if not verdict.allowed:
        headers["Retry-After"] = str(verdict.retry_after)
        return Response("rate limit exceeded", 429, headers, content_type="text/plain")
    headers["Cache-Control"] = f"public, max-age={PUBLIC_CACHE_SECONDS}"
    return Response(
        orjson.dumps(rt.catalog.listing()), 200, headers, content_type="application/json"
    )


def register(app: Quart) -> None:
    app.add_url_rule("/v1/models", "models", list_models, methods=["GET"])
