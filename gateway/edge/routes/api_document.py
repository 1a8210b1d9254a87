"""GET /openapi.json: the OpenAPI 3.1 document of the /v1 API (no key needed)."""

from __future__ import annotations

from quart import Quart, Response

from gateway.edge.http import json_response
from gateway.edge.openapi import document


async def openapi_json() -> Response:
    return json_response(document())


def register(app: Quart) -> None:
    app.add_url_rule("/openapi.json", "openapi", openapi_json, methods=["GET"])
