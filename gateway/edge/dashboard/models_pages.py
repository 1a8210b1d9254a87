"""The Models page: the organisation's callable catalog, exactly as ``/v1/models`` lists it
for any key of the organisation (the same :func:`gateway.calls.policy.org_models`), with
prices per million tokens (input, output, and cached input read and written when set),
capabilities, zero-retention and BYOK availability; models the operator turned off are
listed apart, as such."""

from __future__ import annotations

from quart import Response

from gateway.calls.policy import org_models, org_rules
from gateway.edge.dashboard.web import bp, page, page_user
from gateway.edge.http import runtime


@bp.get("/models")
async def models() -> Response:
    user = await page_user()
    rt = runtime()
    callable_now = org_models(rt, user.org_id)
    org = rt.orgs.get(user.org_id)
    turned_off = [
        m for m in rt.catalog.every() if rt.catalog.is_disabled(m.id) and not org_rules(rt, org, m)
    ]
    return await page(
        "models.html",
        nav="models",
        models=[m.public() | {"config": m.config} for m in callable_now],
        turned_off=[m.public() | {"config": m.config} for m in turned_off],
    )
