"""The Keys pages: the organisation's keys with today's and this month's spend, every
change an owner or admin makes to them, each through :mod:`gateway.accounts.key_actions` (the
admin API's code) so the dashboard follows exactly the rules of the CLI; a key's page also
lists its refused calls of the last 30 days (no record each: counts by day and code)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from quart import Response, request

from gateway.accounts.key_actions import ACTIONS, ROOT_SCOPES, create_root_key, key_action, set_caps
from gateway.accounts.key_record import DATA_MODES, ENVIRONMENTS, SCOPES, KeyRecord
from gateway.edge.dashboard import audit, forms
from gateway.edge.dashboard.web import User, bp, form_user, page, page_user, see_other
from gateway.edge.http import caught_up, runtime
from gateway.edge.routes.key import key_view
from gateway.errors import GatewayError
from gateway.store.refusal_counts import refusal_rows

NOTICES = {
    "disable": "Key {name} is disabled: its calls are refused until it is enabled.",
    "enable": "Key {name} is enabled again.",
    "revoke": "Key {name} is revoked, with its sub-keys. This cannot be undone.",
    "caps": "The caps of key {name} are saved.",
}


async def org_key(user: User, key_id: str) -> KeyRecord:
    """A key of the user's organisation; any other id (another organisation's too) is 404
    (after catching up: the key may have been made through another worker or node)."""
    keyring = runtime().keyring
    if keyring.get(key_id) is None:
        await caught_up()
    record = keyring.get(key_id)
    if record is None or record.org_id != user.org_id:
        raise GatewayError("not_found", f"No key {key_id} in your organisation.")
    return record


async def org_keys(org_id: str) -> list[KeyRecord]:
    """Root keys newest first, each followed by its sub-keys (oldest first), as the
    database has them (:func:`~gateway.edge.http.caught_up`)."""
    await caught_up()
    keys = [r for r in runtime().keyring.all() if r.org_id == org_id]
    roots = sorted((r for r in keys if r.parent_id is None), key=lambda r: -r.created_at)
    ordered: list[KeyRecord] = []
    for root in roots:
        ordered.append(root)
        children = [r for r in keys if r.parent_id == root.id]
        ordered += sorted(children, key=lambda r: r.created_at)
    return ordered


@bp.get("/keys")
async def keys() -> Response:
    user = await page_user()
    show_all = request.args.get("show") == "all"
    rows: list[dict[str, Any]] = []
    hidden = 0
    for record in await org_keys(user.org_id):
        view = await key_view(record)
        if view["status"] == "revoked" and not show_all:
            hidden += 1
            continue
        view["rotated_to"] = record.rotated_to
        rows.append(view)
    notice = None
    action, _, key_id = request.args.get("notice", "").partition(":")
    named = runtime().keyring.get(key_id)
    if action in NOTICES and named is not None and named.org_id == user.org_id:
        notice = NOTICES[action].format(name=named.name)
    return await page(
        "keys.html", nav="keys", keys=rows, hidden=hidden, show_all=show_all, notice=notice
    )


def _form_context(values: dict[str, Any], errors: dict[str, str]) -> dict[str, Any]:
    return {
        "nav": "keys",
        "values": values,
        "errors": errors,
        "environments": ENVIRONMENTS,
        "data_modes": DATA_MODES,
        "scopes": [s for s in SCOPES if s != "keys:manage"],
        "cap_fields": forms.CAP_LABELS,
        "blank": forms.blank_means(),
        "models": [m.id for m in runtime().catalog.every()],
    }


@bp.get("/keys/new")
async def new_key() -> Response:
    user = await page_user()
    if not user.can_edit:
        return await page("error.html", 403, title="Viewers cannot create keys", message="")
    values: dict[str, Any] = {
        "mode": "sandbox",
        "environment": "development",
        "data_mode": "standard",
        "scopes": list(ROOT_SCOPES),
    }
    return await page("key_new.html", **_form_context(values, {}))


@bp.post("/keys")
async def create_key() -> Response:
    user, form = await form_user()
    try:
        record, token = await create_root_key(runtime(), user.org_id, forms.key_body(form))
    except GatewayError as error:
        values: dict[str, Any] = form.to_dict()
        values["scopes"] = form.getlist("scopes")
        context = _form_context(values, {error.param or "form": error.message or ""})
        return await page("key_new.html", 400, **context)
    await audit.record(user, "key.created", record.name, f"{record.prefix} ({record.mode})")
    return await page("key_token.html", nav="keys", key=record, token=token, rotated=None)


@bp.post("/keys/<key_id>/<action>")
async def change_key(key_id: str, action: str) -> Response:
    user, _form = await form_user()
    if action not in ACTIONS:
        raise GatewayError("not_found", "No such action.")
    rt = runtime()
    record, token = await key_action(rt, await org_key(user, key_id), action)
    await audit.record(user, f"key.{action}d", record.name, record.prefix)
    if token is not None:
        old = rt.keyring.get(key_id)
        return await page("key_token.html", nav="keys", key=record, token=token, rotated=old)
    return see_other(f"/dashboard/keys?notice={action}:{record.id}")


def live_children(record: KeyRecord) -> list[KeyRecord]:
    """The sub-keys a revoke or rotation still affects: those not already revoked."""
    return [c for c in runtime().keyring.children(record.id) if c.status != "revoked"]


@bp.get("/keys/<key_id>/<any(revoke, rotate):action>")
async def confirm_action(key_id: str, action: str) -> Response:
    """Revoke and rotate each ask first: one click never ends or replaces a token."""
    user = await page_user()
    record = await org_key(user, key_id)
    return await page(f"key_{action}.html", nav="keys", key=record, children=live_children(record))


def _caps_values(record: KeyRecord) -> dict[str, Any]:
    return {f"caps.{name}": value for name, value in record.caps.public().items()}


#: the key's page lists its refused calls of this many days, today's included
REFUSALS_DAYS = 30


async def _caps_context(
    record: KeyRecord, values: dict[str, Any], errors: dict[str, str]
) -> dict[str, Any]:
    rt = runtime()
    today = datetime.fromtimestamp(rt.clock.now(), UTC).date()
    since = (today - timedelta(days=REFUSALS_DAYS - 1)).isoformat()
    refused = await rt.store.read(refusal_rows, [record.id], None, since, today.isoformat())
    return {
        "nav": "keys",
        "key": record,
        "values": values,
        "errors": errors,
        "cap_fields": forms.CAP_LABELS,
        "blank": forms.blank_means(),
        "refusals": refused,
        "since": since,
    }


@bp.get("/keys/<key_id>/caps")
async def caps_form(key_id: str) -> Response:
    user = await page_user()
    record = await org_key(user, key_id)
    return await page("key_caps.html", **await _caps_context(record, _caps_values(record), {}))


@bp.post("/keys/<key_id>/caps")
async def save_caps(key_id: str) -> Response:
    user, form = await form_user()
    record = await org_key(user, key_id)
    try:
        raw = forms.caps(form)
        await set_caps(runtime(), record, raw)
        await audit.record(user, "key.caps_changed", record.name, record.prefix)
    except GatewayError as error:
        errors = {error.param or "form": error.message or ""}
        context = await _caps_context(record, form.to_dict(), errors)
        return await page("key_caps.html", 400, **context)
    return see_other(f"/dashboard/keys?notice=caps:{record.id}")
