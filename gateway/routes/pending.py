"""Endpoints of the spec that are not built yet.

They authenticate and check the scope like the real ones (so 401, 403 and 405 already
hold on every known path) and then say plainly that the endpoint is not built: 501
not_implemented. Each moves to its own module when it is built.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from quart import Quart, Response

from gateway.auth import authenticate, require_scope
from gateway.errors import GatewayError

# path -> (methods, scope)
PENDING: dict[str, tuple[tuple[str, ...], str]] = {
    "/v1/usage": (("GET",), "usage:read"),
    "/v1/credits": (("GET",), "usage:read"),
    "/v1/requests/<request_id>": (("GET",), "usage:read"),
    "/v1/keys": (("GET", "POST"), "keys:manage"),
    "/v1/keys/<key_id>": (("PATCH", "DELETE"), "keys:manage"),
}


def _handler(path: str, scope: str) -> Callable[..., Awaitable[Response]]:
    async def not_built(**_: str) -> Response:
        record = authenticate()
        require_scope(record, scope)
        raise GatewayError("not_implemented", f"{path} is not built yet in this gateway.")

    return not_built


def register(app: Quart) -> None:
    for path, (methods, scope) in PENDING.items():
        app.add_url_rule(path, f"pending:{path}", _handler(path, scope), methods=list(methods))
