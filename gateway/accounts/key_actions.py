"""Changes to an organisation's keys, whoever asks: the admin API, the CLI through it, and
the dashboard's forms all call these, so a key made or rotated in a browser follows
exactly the rules of ``POST /admin/keys`` and ``svc-gateway key rotate``.

- :func:`create_root_key`: a key of the organisation from a body of
  :data:`KEY_FIELDS` (unknown fields refused, each field checked);
- :func:`key_action`: rotate, revoke, disable or enable one key;
- :func:`set_caps`: new caps for a key (a sub-key's stay within its parent's).
"""

from __future__ import annotations

from typing import Any, Protocol

from gateway.accounts.catalog import Catalog
from gateway.accounts.key_fields import (
    MODEL_LIST,
    guardrail_names,
    model_list_name,
    parse_caps,
    parse_expiry,
    parse_name,
    refuse_unknown_fields,
    string_list,
    tool_patterns,
)
from gateway.accounts.key_record import DATA_MODES, ENVIRONMENTS, MODES, SCOPES, Caps, KeyRecord
from gateway.accounts.keyring import Keyring
from gateway.accounts.subkey_rules import child_caps
from gateway.accounts.tag_rules import check_tag_map
from gateway.config.settings import Config
from gateway.errors import GatewayError
from shards.clock import Clock


class KeyDesk(Protocol):
    """What key changes use of the server (the runtime is one)."""

    @property
    def catalog(self) -> Catalog: ...
    @property
    def keyring(self) -> Keyring: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def config(self) -> Config: ...


ROOT_SCOPES = ("inference", "embeddings", "usage:read")
ACTIONS = ("rotate", "revoke", "disable", "enable")

#: the body of POST /admin/keys (DECISIONS.md, admin API table)
KEY_FIELDS = (
    "org_id", "name", "mode", "environment", "scopes", "keys_manage", "caps",
    "data_mode", "byok", MODEL_LIST, "required_tags", "default_tags", "expires_at",
    "guardrails",
    "allowed_tools",
)  # fmt: skip


def root_key_settings(rt: KeyDesk, body: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments of :meth:`Keyring.build` (besides org and name) from a key body."""
    # refused, not ignored: a typo ("allowed_model") or a field of sub-keys ("parent_id")
    # must not silently give a key without what was asked
    refuse_unknown_fields(body, KEY_FIELDS, "a key body")
    listed = model_list_name(body)
    mode = body.get("mode", "sandbox")
    if mode not in MODES:
        raise GatewayError("invalid_request", "mode must be live or sandbox.", param="mode")
    environment = body.get("environment", "development")
    if environment not in ENVIRONMENTS:
        raise GatewayError("invalid_request", "Unknown environment.", param="environment")
    scopes = string_list(body, "scopes") or ROOT_SCOPES
    if any(scope not in SCOPES for scope in scopes):
        raise GatewayError("invalid_request", "Unknown scope.", param="scopes")
    if _flag(body, "keys_manage") and "keys:manage" not in scopes:
        scopes = (*scopes, "keys:manage")
    data_mode = body.get("data_mode", "standard")
    if data_mode not in DATA_MODES:
        raise GatewayError("invalid_request", "Unknown data mode.", param="data_mode")
    allowed = string_list(body, listed)
    if allowed is not None:
        unknown = [m for m in allowed if rt.catalog.get(m) is None]
        if unknown:
            raise GatewayError(
                "model_not_in_catalog",
                f"Not in the catalog: {', '.join(unknown)}.",
                listed,
            )
    return {
        "mode": mode,
        "environment": environment,
        "scopes": tuple(dict.fromkeys(scopes)),
        "caps": parse_caps(body.get("caps"), Caps()),
        "data_mode": data_mode,
        "byok": _flag(body, "byok"),
        "allowed_models": allowed,
        "allowed_tools": tool_patterns(body),
        "required_tags": check_tag_map(body.get("required_tags"), "required_tags"),
        "default_tags": check_tag_map(body.get("default_tags"), "default_tags"),
        "expires_at": parse_expiry(body.get("expires_at")),
        "guardrails": guardrail_names(body, (g.name for g in rt.config.guardrails)),
    }


def _flag(body: dict[str, Any], name: str) -> bool:
    """A boolean field: absent or null is false; "no" or 1 is a 400, not its truthiness."""
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise GatewayError("invalid_request", f"{name} must be a boolean.", param=name)
    return value


async def create_root_key(rt: KeyDesk, org_id: str, body: dict[str, Any]) -> tuple[KeyRecord, str]:
    """A new key of the organisation ``org_id`` (known to the caller) and its token."""
    name = parse_name(body)
    settings = root_key_settings(rt, body)
    record, token = rt.keyring.build(org_id=org_id, name=name, **settings)
    await rt.keyring.insert(record)
    return record, token


async def key_action(rt: KeyDesk, record: KeyRecord, action: str) -> tuple[KeyRecord, str | None]:
    """Apply one of :data:`ACTIONS`; a rotation answers the new key and its token."""
    if action == "rotate":
        if record.parent_id is not None:
            raise GatewayError(
                "invalid_request", "A sub-key is not rotated: revoke and recreate it."
            )
        if record.effective_status(rt.clock.now()) in ("revoked", "expired"):
            raise GatewayError("key_revoked", "A revoked or expired key cannot be rotated.")
        return await rt.keyring.rotate(record, rt.config.server.rotation_grace_s)
    if action == "revoke":
        return await rt.keyring.revoke(record), None
    if record.status == "revoked":
        raise GatewayError("key_revoked", "The key is revoked; it cannot be changed.")
    status = "disabled" if action == "disable" else "active"
    return await rt.keyring.change(record, status=status), None


async def set_caps(rt: KeyDesk, record: KeyRecord, raw: Any) -> KeyRecord:
    """Caps fields given in ``raw`` replace the key's (null: unlimited, where allowed).

    A sub-key's caps stay within its parent's, as at its creation; a parent's may go
    below its sub-keys' (every call is checked against both)."""
    if raw is None:
        raise GatewayError("invalid_request", "caps is required.", param="caps")
    if record.status == "revoked":
        raise GatewayError("key_revoked", "The key is revoked; it cannot be changed.")
    parent = rt.keyring.get(record.parent_id) if record.parent_id else None
    if parent is not None:
        caps = child_caps(parent.caps, {**record.caps.public(), **_object(raw)})
    else:
        caps = parse_caps(raw, record.caps)
    return await rt.keyring.change(record, caps=caps)


def _object(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise GatewayError("invalid_request", "caps must be an object.", param="caps")
    return raw
