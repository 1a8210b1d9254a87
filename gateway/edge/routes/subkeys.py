"""/v1/keys: a key holding keys:manage lists, creates, disables and revokes its sub-keys.

Every handler walks steps 1-3 (authenticate, scope keys:manage, admit without an
in-flight slot, so the request counts against rpm and the answer carries the rate-limit
headers). A caller sees and changes only its own sub-keys: any other id, another
organisation's included, is 404 not_found. A rotated key, during its grace window,
manages the sub-keys that moved under its successor. The creation rules are in
:mod:`gateway.accounts.subkey_rules`.
"""

from __future__ import annotations

from typing import Any

from quart import Quart, Response, request

from gateway.accounts.key_fields import refuse_unknown_fields
from gateway.accounts.key_record import KeyRecord
from gateway.accounts.subkey_rules import child_settings
from gateway.calls.policy import callable_models
from gateway.edge.auth import admit_reader
from gateway.edge.http import caught_up, json_response, read_json_object, runtime
from gateway.errors import GatewayError

DEFAULT_LIMIT = 20
MAX_LIMIT = 100


async def _manager() -> KeyRecord:
    """The key whose sub-keys the caller manages: itself, or its successor if rotated."""
    rt = runtime()
    caller = await admit_reader(rt, "keys:manage")
    return rt.keyring.successor(caller)


async def _own_child(manager: KeyRecord, key_id: str) -> KeyRecord:
    keyring = runtime().keyring
    if keyring.get(key_id) is None:
        await caught_up()
    record = keyring.get(key_id)
    if record is None or record.parent_id != manager.id:
        raise GatewayError("not_found", f"No sub-key {key_id} for this key.", param="key_id")
    return record


def _limit() -> int:
    raw = request.args.get("limit")
    if raw is None:
        return DEFAULT_LIMIT
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_LIMIT:
        raise GatewayError(
            "invalid_request", f"limit must be an integer from 1 to {MAX_LIMIT}.", "limit"
        )
    return int(raw)


async def list_sub_keys() -> Response:
    """Oldest first; ``after`` is the id of the last sub-key of the previous page. An id
    that is none of the caller's sub-keys is 404 not_found, as on PATCH and DELETE."""
    manager = await _manager()
    limit = _limit()
    await caught_up()
    rt = runtime()
    children = sorted(rt.keyring.children(manager.id), key=lambda r: (r.created_at, r.id))
    after = request.args.get("after")
    if after is not None:
        ids = [child.id for child in children]
        if after not in ids:
            raise GatewayError("not_found", f"No sub-key {after} to page after.", "after")
        children = children[ids.index(after) + 1 :]
    now = rt.clock.now()
    page = [child.public(now) for child in children[:limit]]
    return json_response({"object": "list", "data": page, "has_more": len(children) > limit})


async def create_sub_key() -> Response:
    manager = await _manager()
    body = await read_json_object()
    rt = runtime()
    catalog = {model.id for model in callable_models(rt, manager)}
    guardrails = [g.name for g in rt.config.guardrails]
    settings = child_settings(manager, body, catalog, guardrails)
    record, token = rt.keyring.build(**settings)
    record = await rt.keyring.insert_child(record)
    view = record.public(rt.clock.now())
    view["token"] = token
    return json_response(view, 201)


def _disabled(body: dict[str, Any]) -> bool:
    refuse_unknown_fields(body, ("disabled",), "a sub-key change")
    disabled = body.get("disabled")
    if not isinstance(disabled, bool):
        raise GatewayError("invalid_request", "disabled must be true or false.", "disabled")
    return disabled


async def change_sub_key(key_id: str) -> Response:
    manager = await _manager()
    record = await _own_child(manager, key_id)
    disabled = _disabled(await read_json_object())
    rt = runtime()
    record = await rt.keyring.change(record, status="disabled" if disabled else "active")
    return json_response(record.public(rt.clock.now()))


async def revoke_sub_key(key_id: str) -> Response:
    manager = await _manager()
    rt = runtime()
    record = await rt.keyring.revoke(await _own_child(manager, key_id))
    view = record.public(rt.clock.now())
    view["deleted"] = True
    return json_response(view)


def register(app: Quart) -> None:
    app.add_url_rule("/v1/keys", "list_sub_keys", list_sub_keys, methods=["GET"])
    app.add_url_rule("/v1/keys", "create_sub_key", create_sub_key, methods=["POST"])
    app.add_url_rule("/v1/keys/<key_id>", "change_sub_key", change_sub_key, methods=["PATCH"])
    app.add_url_rule("/v1/keys/<key_id>", "revoke_sub_key", revoke_sub_key, methods=["DELETE"])
