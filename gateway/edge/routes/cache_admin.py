"""POST /admin/cache/clear: drop the response cache's entries (all, or one organisation's),
what ``svc-gateway cache clear [--org ORG_ID]`` calls. With several nodes the entries are
in the shared database: one call clears them for every node."""

from __future__ import annotations

from quart import Quart, Response

from gateway.accounts.key_fields import refuse_unknown_fields
from gateway.edge.http import json_response, read_json_object, runtime
from gateway.edge.routes.admin import add_routes, authorize_admin, org_or_404
from gateway.errors import GatewayError
from gateway.store import cache_entries


async def clear_cache() -> Response:
    authorize_admin()
    body = await read_json_object()
    refuse_unknown_fields(body, ("org_id",), "a cache clear body")
    org_id = body.get("org_id")
    if org_id is not None:
        if not isinstance(org_id, str):
            raise GatewayError("invalid_request", "org_id must be a string.", param="org_id")
        await org_or_404(org_id)
    cleared = await runtime().store.write(cache_entries.clear, org_id)
    return json_response({"cleared": cleared, "org_id": org_id})


def register(app: Quart) -> None:
    add_routes(app, (("POST", "/admin/cache/clear", clear_cache),))
