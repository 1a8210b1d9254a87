"""The admin API under /admin: the spec's "dashboard", used by the CLI.

Bearer = ``SVC_ADMIN_TOKEN``. Without that variable every /admin path answers 404, as
if it did not exist. Bodies and answers are JSON; errors use the same catalog.

Ids in paths take the ``path`` converter: a model id may hold ``/`` (``meta/llama-x``),
and an org or key id that holds one (even percent-encoded, which the server decodes
before routing) is answered "no such organization/key", not "no such endpoint".
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from quart import Quart, Response, request

from gateway.accounts.catalog import nanos_to_usd, usd_to_nanos
from gateway.accounts.key_actions import create_root_key, key_action, set_caps
from gateway.accounts.key_fields import number, refuse_unknown_fields
from gateway.accounts.key_record import KeyRecord
from gateway.accounts.orgs import Org, validate_policy
from gateway.edge.auth import bearer_token
from gateway.edge.http import caught_up, json_response, read_json_object, runtime
from gateway.errors import GatewayError
from gateway.observe.alerts import check_webhook_url
from gateway.store import node_leases, records


def authorize_admin() -> None:
    """The admin bearer, compared in constant time; without an admin token, /admin is 404.
    Shared with the user admin API of the dashboard (`gateway/edge/dashboard/admin_users.py`)."""
    expected = runtime().admin_token
    if expected is None:
        raise GatewayError("not_found", "No such endpoint.")
    token = bearer_token() or ""
    if not hmac.compare_digest(token.encode(), expected.encode()):
        raise GatewayError("invalid_api_key", "The admin token is invalid.")


async def org_or_404(org_id: str) -> Org:
    orgs = runtime().orgs
    if org_id not in orgs:
        await caught_up()
    org = orgs.get(org_id)
    if org is None:
        raise GatewayError("not_found", f"No organization {org_id}.")
    return org


async def authorized_create() -> tuple[dict[str, Any], Org]:
    """A create call of the admin API: the admin bearer checked, then the JSON body and the
    organisation its ``org_id`` names (a 404 if there is none)."""
    authorize_admin()
    body = await read_json_object()
    return body, await org_or_404(str(body.get("org_id", "")))


async def authorized_org_filter() -> str | None:
    """A list call of the admin API: the admin bearer checked, then its ``org_id`` query
    parameter, if any (an unknown organisation is a 404, not an empty list)."""
    authorize_admin()
    org_id = request.args.get("org_id")
    if org_id is not None:
        await org_or_404(org_id)
    return org_id


def list_response(data: list[Any]) -> Response:
    return json_response({"object": "list", "data": data})


async def _key(key_id: str) -> KeyRecord:
    keyring = runtime().keyring
    if keyring.get(key_id) is None:
        await caught_up()
    record = keyring.get(key_id)
    if record is None:
        raise GatewayError("not_found", f"No key {key_id}.")
    return record


def _org_view(org: Org) -> dict[str, Any]:
    account = runtime().pool.org_snapshot(org.id)
    return {
        "object": "organization",
        "id": org.id,
        "name": org.name,
        "residency": org.residency,
        "balance_usd": nanos_to_usd(account.balance),
        "policy": org.policy,
    }


# -- organisations ---------------------------------------------------------------------------


async def create_org() -> Response:
    authorize_admin()
    body = await read_json_object()
    refuse_unknown_fields(body, ("name", "credits_usd", "residency"), "an organisation body")
    name = body.get("name")
    if not isinstance(name, str) or not name.strip():
        raise GatewayError("invalid_request", "name is required.", param="name")
    residency = body.get("residency")
    if residency is not None and not isinstance(residency, str):
        raise GatewayError("invalid_request", "residency must be a string.", param="residency")
    credits = number(body, "credits_usd") or 0
    rt = runtime()
    org = rt.org_from_new(name.strip(), residency)
    await rt.store.write(records.create_org, org.to_row())
    rt.orgs[org.id] = org
    rt.pool.set_org(org.id, credits_nanos=0, budget_month_nanos=None)
    if credits:
        await _add_credits(org, usd_to_nanos(credits))
    return json_response(_org_view(org), 201)


async def list_orgs() -> Response:
    authorize_admin()
    await caught_up()
    return list_response([_org_view(org) for org in runtime().orgs.values()])


async def _add_credits(org: Org, nanos: int) -> None:
    rt = runtime()
    await rt.store.write(records.add_ledger_row, rt.ledger_row(org.id, nanos, "purchase"))
    rt.pool.add_org_credits(org.id, nanos)


async def add_credits(org_id: str) -> Response:
    authorize_admin()
    org = await org_or_404(org_id)
    body = await read_json_object()
    refuse_unknown_fields(body, ("add_usd",), "a credits body")
    amount = number(body, "add_usd")
    if not amount:
        raise GatewayError("invalid_request", "add_usd must be a positive number.", param="add_usd")
    await _add_credits(org, usd_to_nanos(amount))
    return json_response({"org_id": org.id, "balance_usd": _org_view(org)["balance_usd"]})


async def set_policy(org_id: str) -> Response:
    authorize_admin()
    org = await org_or_404(org_id)
    policy = validate_policy(await read_json_object("policy"))
    rt = runtime()
    rt.call_parts.guardrails.check_names(policy.get("guardrails"), "guardrails")
    await rt.store.write(records.set_org_policy, org.id, policy)
    rt.orgs[org.id] = org.with_policy(policy)
    budget = policy.get("budget_usd_month")
    rt.pool.set_org_budget(org.id, usd_to_nanos(budget) if budget is not None else None)
    return json_response(policy)


async def set_byok(org_id: str) -> Response:
    authorize_admin()
    org = await org_or_404(org_id)
    body = await read_json_object()
    refuse_unknown_fields(body, ("provider", "api_key_env"), "a BYOK body")
    provider, env = body.get("provider"), body.get("api_key_env")
    if not isinstance(provider, str) or not provider:
        raise GatewayError("invalid_request", "provider is required.", param="provider")
    known = [p.name for p in runtime().config.providers]
    if provider not in known:
        raise GatewayError(
            "invalid_request",
            f"No provider {provider!r} in the config; known: {', '.join(known)}.",
            param="provider",
        )
    if not isinstance(env, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", env):
        raise GatewayError(
            "invalid_request",
            "api_key_env must name an environment variable (letters, digits, _).",
            param="api_key_env",
        )
    row = {"org_id": org.id, "provider": provider, "api_key_env": env, "created_at": 0.0}
    row["created_at"] = runtime().clock.now()
    await runtime().store.write(records.set_provider_credential, row)
    runtime().byok[(org.id, provider)] = env
    return json_response({"org_id": org.id, "provider": provider, "api_key_env": env})


async def set_webhook(org_id: str) -> Response:
    """Spend alerts of the organisation go to ``url``; the signing secret is shown once."""
    authorize_admin()
    org = await org_or_404(org_id)
    body = await read_json_object()
    refuse_unknown_fields(body, ("url",), "a webhook body")
    url = check_webhook_url(body.get("url"))
    secret = await runtime().alerts.set_webhook(org.id, url)
    return json_response({"org_id": org.id, "url": url, "secret": secret})


# -- keys ------------------------------------------------------------------------------------


def _with_token(record: KeyRecord, token: str) -> dict[str, Any]:
    view = record.public(runtime().clock.now())
    view["token"] = token
    return view


async def create_key() -> Response:
    body, org = await authorized_create()
    record, token = await create_root_key(runtime(), org.id, body)
    return json_response(_with_token(record, token), 201)


async def list_keys() -> Response:
    org_id = await authorized_org_filter()
    await caught_up()
    rt = runtime()
    now = rt.clock.now()
    return list_response(
        [r.public(now) for r in rt.keyring.all() if org_id is None or r.org_id == org_id]
    )


async def change_key(key_id: str, action: str) -> Response:
    authorize_admin()
    rt = runtime()
    record, token = await key_action(rt, await _key(key_id), action)
    if token is not None:
        return json_response(_with_token(record, token), 201)
    return json_response(record.public(rt.clock.now()))


async def change_caps(key_id: str) -> Response:
    """PATCH /admin/keys/{id}/caps: the caps fields given replace the key's."""
    authorize_admin()
    record = await _key(key_id)
    rt = runtime()
    record = await set_caps(rt, record, await read_json_object("caps"))
    return json_response(record.public(rt.clock.now()))


async def list_models() -> Response:
    authorize_admin()
    catalog = runtime().catalog
    rows = [
        {**model.public(), "enabled": not catalog.is_disabled(model.id)}
        for model in catalog.every()
    ]
    return list_response(rows)


async def model_action(model_id: str, action: str) -> Response:
    """Switch a model off (calls answer 503 model_unavailable) or on; the switch is
    stored, so it outlives a restart (with several nodes: on every node)."""
    authorize_admin()
    rt = runtime()
    enabled = action == "enable"
    model = rt.catalog.set_enabled(model_id, enabled)
    if model is None:
        raise GatewayError("not_found", f"No model {model_id}.")
    if rt.cluster is not None:
        await rt.cluster.switch_model(model_id, enabled)
    else:
        await rt.store.write(node_leases.switch_model, model_id, enabled, rt.clock.now())
    return json_response({**model.public(), "enabled": enabled})


def add_routes(
    app: Quart, routes: Iterable[tuple[str, str, Callable[..., Awaitable[Response]]]]
) -> None:
    """Route each (method, path, view) of an admin API table; the endpoint is named
    ``admin_<view>``. Shared with the user admin API of the dashboard."""
    for method, path, view in routes:
        app.add_url_rule(path, f"admin_{view.__name__}", view, methods=[method])


def register(app: Quart) -> None:
    org_actions = (
        ("POST", "credits", add_credits),
        ("PUT", "policy", set_policy),
        ("PUT", "byok", set_byok),
        ("PUT", "webhook", set_webhook),
    )
    add_routes(
        app,
        (
            ("GET", "/admin/models", list_models),
            ("POST", "/admin/models/<path:model_id>/<any(disable, enable):action>", model_action),
            ("POST", "/admin/orgs", create_org),
            ("GET", "/admin/orgs", list_orgs),
            *(
                (method, f"/admin/orgs/<path:org_id>/{part}", view)
                for method, part, view in org_actions
            ),
            ("POST", "/admin/keys", create_key),
            ("GET", "/admin/keys", list_keys),
            (
                "POST",
                "/admin/keys/<path:key_id>/<any(rotate, revoke, disable, enable):action>",
                change_key,
            ),
            ("PATCH", "/admin/keys/<path:key_id>/caps", change_caps),
        ),
    )
