"""Small HTTP helpers shared by the routes: JSON answers, body parsing, the request id."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

import orjson
from quart import Response, current_app, g, request

from gateway.errors import GatewayError

if TYPE_CHECKING:
    from gateway.runtime import Runtime


def new_request_id() -> str:
    return f"req_{secrets.token_hex(12)}"


def runtime() -> Runtime:
    return current_app.config["RUNTIME"]


def request_id() -> str:
    return g.request_id


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(data),
        status=status,
        headers=headers or {},
        content_type="application/json",
    )


async def read_json_object(param: str | None = None) -> dict[str, Any]:
    """The request body as a JSON object, or 400 invalid_request."""
    raw = await request.get_data(cache=True)
    if not raw:
        raise GatewayError("invalid_request", "The request body must be a JSON object.", param)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise GatewayError(
            "invalid_request", "The request body is not valid JSON.", param
        ) from None
    if not isinstance(body, dict):
        raise GatewayError("invalid_request", "The request body must be a JSON object.", param)
    return body
