"""GET /v1/models and GET /v1/models/{id}: the public catalog without a key, the
organisation's catalog with one.

Both read the same list under the same rules: without ``Authorization`` the public
catalog and its per-IP limit; with a key the inference scope, the key's request window
and the models no organisation or contract rule denies. One model is found by its id or
by an alias of exactly one model; anything else is 404 ``model_not_found``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import orjson
from quart import Quart, Response, request

from gateway.accounts.catalog import Model
from gateway.accounts.usd_json import plain_amounts
from gateway.calls.policy import callable_models, model_not_found
from gateway.edge.auth import admit_reader
from gateway.edge.http import json_response, runtime
from gateway.errors import GatewayError, retry_hint

PUBLIC_CACHE_SECONDS = 300


async def list_models() -> Response:
    rt = runtime()
    if "Authorization" not in request.headers:
        return _public(rt.catalog.listing)
    record = await admit_reader(rt, "inference")
    return json_response(rt.catalog.listing(callable_models(rt, record)))


async def retrieve_model(model_id: str) -> Response:
    rt = runtime()
    if "Authorization" not in request.headers:
        return _public(lambda: _find(rt.catalog.models.values(), model_id).public())
    record = await admit_reader(rt, "inference")
    return json_response(_find(callable_models(rt, record), model_id).public())


def _find(visible: Iterable[Model], name: str) -> Model:
    """The visible model ``name`` means: its id, or an alias of exactly one model."""
    by_id = {model.id: model for model in visible}
    candidates = runtime().catalog.candidates(name)
    model = by_id.get(candidates[0]) if len(candidates) == 1 else None
    if model is None:
        raise model_not_found(name)
    return model


def _public(answer: Callable[[], dict[str, Any]]) -> Response:
    """A keyless answer: counted per IP address, its headers on every answer, a 404 too."""
    rt = runtime()
    verdict = rt.public_limiter.hit(request.remote_addr or "unknown")
    headers = {
        "X-RateLimit-Limit": str(verdict.limit),
        "X-RateLimit-Remaining": str(verdict.remaining),
    }
    if not verdict.allowed:
        headers["Retry-After"] = str(verdict.retry_after)
        headers.update(retry_hint(True))
        return Response("rate limit exceeded", 429, headers, content_type="text/plain")
    try:
        body = answer()
    except GatewayError as error:
        error.headers.update(headers)
        raise
    headers["Cache-Control"] = f"public, max-age={PUBLIC_CACHE_SECONDS}"
    return Response(
        orjson.dumps(plain_amounts(body)), 200, headers, content_type="application/json"
    )


def register(app: Quart) -> None:
    app.add_url_rule("/v1/models", "models", list_models, methods=["GET"])
    # model ids may hold a "/" (meta/llama-x): the rest of the path is the id
    app.add_url_rule("/v1/models/<path:model_id>", "model", retrieve_model, methods=["GET"])
