"""GET /openapi.json: the OpenAPI 3.1 document of the /v1 API (no key needed).

With a valid key (``Authorization: Bearer``) the document is that key's: its output
budget and what its sub-keys may be are written as bounds (gateway/edge/openapi_served.py).
A key that is not valid gets the server's document, as a request without one: this
endpoint never refuses, and counts in no key's request window.
"""

from __future__ import annotations

from quart import Quart, Response

from gateway.calls.policy import callable_models
from gateway.edge.auth import authenticate, bearer_token
from gateway.edge.http import json_response, runtime
from gateway.edge.openapi_served import KeyFacts, key_facts, served_document, server_facts
from gateway.errors import GatewayError


async def openapi_json() -> Response:
    """The document, its examples and enums naming models this server serves (enabled now)."""
    rt = runtime()
    server = server_facts(rt.catalog, (g.name for g in rt.config.guardrails))
    return json_response(served_document(server, await _caller()))


async def _caller() -> KeyFacts | None:
    rt = runtime()
    if not bearer_token():
        return None
    try:
        caller = await authenticate(rt)
    except GatewayError:
        return None
    manager = rt.keyring.successor(caller)
    return key_facts(caller, manager, [m.id for m in callable_models(rt, manager)])


def register(app: Quart) -> None:
    app.add_url_rule("/openapi.json", "openapi", openapi_json, methods=["GET"])
