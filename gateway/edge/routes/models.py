"""GET /v1/models and GET /v1/models/{id}: the public catalog without a key, the
organisation's catalog with one.

Both read the same list under the same rules: without ``Authorization`` the public
catalog and its per-IP limit; with a key the inference scope, the key's request window
and the models no organisation or contract rule denies. One model is found by its id or
by an alias of exactly one model; anything else is 404 ``model_not_found``.

A request with an ``anthropic-version`` header (the Anthropic SDKs, Claude Code) gets
Anthropic's shape: chat models only, each ``{"type": "model", "id", "display_name",
"created_at"}`` (RFC 3339), the list with ``has_more`` (always false: one page),
``first_id`` and ``last_id``; every other request OpenAI's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

import orjson
from quart import Quart, Response, request

from gateway.accounts.catalog import CATALOG_CREATED, Model
from gateway.accounts.usd_json import plain_amounts
from gateway.calls.policy import callable_models, model_not_found
from gateway.edge.auth import admit_reader
from gateway.edge.http import json_response, runtime
from gateway.errors import GatewayError, retry_hint

PUBLIC_CACHE_SECONDS = 300
#: the header that asks for Anthropic's shapes
ANTHROPIC_VERSION = "anthropic-version"


async def list_models() -> Response:
    rt = runtime()
    listing = anthropic_listing if ANTHROPIC_VERSION in request.headers else rt.catalog.listing
    if "Authorization" not in request.headers:
        return _public(lambda: listing(list(rt.catalog.models.values())))
    record = await admit_reader(rt, "inference")
    return json_response(listing(callable_models(rt, record)))


async def retrieve_model(model_id: str) -> Response:
    rt = runtime()
    shape = anthropic_model if ANTHROPIC_VERSION in request.headers else Model.public
    if "Authorization" not in request.headers:
        return _public(lambda: shape(_find(rt.catalog.models.values(), model_id)))
    record = await admit_reader(rt, "inference")
    return json_response(shape(_find(callable_models(rt, record), model_id)))


def anthropic_model(model: Model) -> dict[str, Any]:
    """A model in Anthropic's shape (``display_name``: the id, the only name it has)."""
    created = datetime.fromtimestamp(CATALOG_CREATED, UTC).isoformat().replace("+00:00", "Z")
    return {"type": "model", "id": model.id, "display_name": model.id, "created_at": created}


def anthropic_listing(models: list[Model]) -> dict[str, Any]:
    """Anthropic's list of the chat models among ``models``, one page."""
    data = [anthropic_model(model) for model in models if model.kind == "chat"]
    return {
        "data": data,
        "has_more": False,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }


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
        "Vary": ANTHROPIC_VERSION,  # two shapes of one URL: a cache keeps them apart
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
