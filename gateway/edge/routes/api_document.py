"""GET /openapi.json: the OpenAPI 3.1 document of the /v1 API (no key needed)."""

from __future__ import annotations

from quart import Quart, Response

from gateway.edge.http import json_response, runtime
from gateway.edge.openapi import served_document


async def openapi_json() -> Response:
    """The document, its examples naming models this server serves (enabled now)."""
    models = runtime().catalog.models.values()
    return json_response(served_document((model.id, model.kind) for model in models))


def register(app: Quart) -> None:
    app.add_url_rule("/openapi.json", "openapi", openapi_json, methods=["GET"])
