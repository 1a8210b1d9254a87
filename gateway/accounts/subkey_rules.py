"""The creation rules of a sub-key, as pure functions of the parent and the body.

:func:`child_settings` reads a ``POST /v1/keys`` body and answers the settings of the
new sub-key, or the first refusal, in this order:

1. the body holds only known fields (else invalid_request naming the field);
2. ``name``: a string of 1 to 200 characters;
3. ``mode``, ``environment`` and ``byok`` are the parent's: they may be repeated with
   the parent's value, any other value is invalid_request naming the field;
4. ``scopes``: a subset of inference, embeddings and usage:read (keys:manage or an
   unknown scope is invalid_request) and of the parent's (else child_exceeds_parent);
5. ``caps``: each field at most the parent's (a cap the parent leaves unlimited can be
   anything), else child_exceeds_parent with param ``caps.<field>``;
6. ``data_mode``: as strict as the parent's or stricter
   (standard < zero_retention < confidential), else child_exceeds_parent;
7. ``allowed_model_keys`` (or its older name ``allowed_models``): every model in the
   organisation's API catalog (else model_not_in_catalog) and in the parent's list (else
   child_exceeds_parent);
   ``allowed_tools``: MCP tool patterns, each within the parent's (else
   child_exceeds_parent); left out, the parent's;
8. ``required_tags``: merged with the parent's, which stay required (a value the parent
   pins cannot be changed: child_exceeds_parent); ``default_tags`` merged over the
   parent's (the child's win);
9. ``expires_at``: ISO 8601, not later than the parent's expiry (else
   child_exceeds_parent); a time already past makes a sub-key expired from its creation.
10. ``guardrails``: names of the server's ``[[guardrails]]`` (else invalid_request),
    added to the parent's, which stay (a sub-key cannot remove one).

A setting left out is the parent's, never unlimited. One level only is enforced by
the scope: a sub-key never holds keys:manage, so it cannot reach ``POST /v1/keys``.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from gateway.accounts import key_fields
from gateway.accounts.key_record import CAP_FIELDS, DATA_MODES, SCOPES, Caps, KeyRecord
from gateway.accounts.tag_rules import check_tag_map
from gateway.accounts.tool_rules import covered
from gateway.errors import GatewayError

#: the scopes a sub-key may hold
SUB_KEY_SCOPES = ("inference", "embeddings", "usage:read")
INHERITED = ("mode", "environment", "byok")
#: the fields of a POST /v1/keys body, in the order the refusal of another one lists them
FIELDS = (
    "name",
    "scopes",
    "caps",
    "data_mode",
    key_fields.MODEL_LIST,
    "allowed_tools",
    "required_tags",
    "default_tags",
    "expires_at",
    "guardrails",
    *INHERITED,
)


def _exceeds(message: str, param: str) -> GatewayError:
    return GatewayError("child_exceeds_parent", message, param=param)


def child_settings(
    parent: KeyRecord,
    body: dict[str, Any],
    catalog: Collection[str],
    guardrails: Collection[str] = (),
) -> dict[str, Any]:
    """Keyword arguments of :meth:`Keyring.build` for a sub-key of ``parent``.

    ``catalog`` holds the ids of the models of the organisation's API catalog,
    ``guardrails`` the names of the server's ``[[guardrails]]``.
    """
    key_fields.refuse_unknown_fields(body, FIELDS, "a sub-key body")
    name = key_fields.parse_name(body)
    for field in INHERITED:
        inherited = getattr(parent, field)
        # the parent's value, of its type: 0 is not false (nor 1.0 true)
        if field in body and (type(body[field]) is not type(inherited) or body[field] != inherited):
            raise GatewayError(
                "invalid_request",
                f"{field} is inherited from the parent key and cannot be changed.",
                param=field,
            )
    return {
        "org_id": parent.org_id,
        "name": name,
        "mode": parent.mode,
        "family_id": parent.family_id,
        "parent_id": parent.id,
        "environment": parent.environment,
        "byok": parent.byok,
        "scopes": _scopes(parent, body),
        "caps": child_caps(parent.caps, body.get("caps")),
        "data_mode": _data_mode(parent.data_mode, body),
        "allowed_models": _allowed_models(parent.allowed_models, body, catalog),
        "allowed_tools": _allowed_tools(parent.allowed_tools, body),
        "required_tags": _required_tags(parent.required_tags, body),
        "default_tags": _default_tags(parent.default_tags, body),
        "expires_at": _expiry(parent.expires_at, body),
        "guardrails": key_fields.guardrail_names(body, guardrails, parent.guardrails),
    }


def _scopes(parent: KeyRecord, body: dict[str, Any]) -> tuple[str, ...]:
    scopes = key_fields.string_list(body, "scopes")
    if scopes is None:
        return tuple(s for s in parent.scopes if s in SUB_KEY_SCOPES)
    for scope in scopes:
        if scope not in SUB_KEY_SCOPES:
            why = "a sub-key cannot hold it" if scope in SCOPES else "unknown scope"
            raise GatewayError(
                "invalid_request",
                f"Scope {scope!r} is not allowed ({why}); a sub-key's scopes are a subset "
                f"of {', '.join(SUB_KEY_SCOPES)}.",
                param="scopes",
            )
        if scope not in parent.scopes:
            raise _exceeds(f"The parent key does not hold the {scope} scope.", "scopes")
    return scopes


def child_caps(parent: Caps, raw: Any) -> Caps:
    """Caps from ``raw`` over the parent's, each at most the parent's (rule 5)."""
    caps = key_fields.parse_caps(raw, parent)
    for field in CAP_FIELDS:
        limit, value = getattr(parent, field), getattr(caps, field)
        if limit is not None and (value is None or value > limit):
            raise _exceeds(f"caps.{field} is above the parent's ({limit}).", f"caps.{field}")
    return caps


def _data_mode(parent: str, body: dict[str, Any]) -> str:
    mode = body.get("data_mode", parent)
    if mode not in DATA_MODES:
        raise GatewayError(
            "invalid_request",
            f"data_mode must be one of {', '.join(DATA_MODES)}.",
            param="data_mode",
        )
    if DATA_MODES.index(mode) < DATA_MODES.index(parent):
        raise _exceeds(f"data_mode can only be as strict as {parent} or stricter.", "data_mode")
    return str(mode)


def _allowed_tools(parent: tuple[str, ...] | None, body: dict[str, Any]) -> tuple[str, ...] | None:
    """A sub-key's tool patterns narrow its parent's, never widen them."""
    patterns = key_fields.tool_patterns(body)
    if patterns is None:
        return parent
    beyond = [p for p in patterns if not covered(parent, p)]
    if beyond:
        raise _exceeds(f"Not allowed to the parent key: {', '.join(beyond)}.", "allowed_tools")
    return patterns


def _allowed_models(
    parent: tuple[str, ...] | None, body: dict[str, Any], catalog: Collection[str]
) -> tuple[str, ...] | None:
    name = key_fields.model_list_name(body)
    models = key_fields.string_list(body, name)
    if models is None:
        return parent
    if not models:
        raise GatewayError(
            "invalid_request",
            f"{name} must name at least one model; leave it out to inherit the parent's list.",
            param=name,
        )
    outside = [m for m in models if m not in catalog]
    if outside:
        raise GatewayError(
            "model_not_in_catalog",
            f"Not in the organization's catalog: {', '.join(outside)}.",
            param=name,
        )
    beyond = [m for m in models if parent is not None and m not in parent]
    if beyond:
        raise _exceeds(f"Not allowed to the parent key: {', '.join(beyond)}.", name)
    return models


def _required_tags(parent: dict[str, str], body: dict[str, Any]) -> dict[str, str]:
    """The parent's required tags and the child's; an empty value accepts any value."""
    merged = check_tag_map(body.get("required_tags"), "required_tags")
    for key, pinned in parent.items():
        mine = merged.get(key, "")
        if pinned and mine and mine != pinned:
            raise _exceeds(f"The parent requires the tag {key}={pinned}.", "required_tags")
        merged[key] = mine or pinned
    return check_tag_map(merged, "required_tags")


def _default_tags(parent: dict[str, str], body: dict[str, Any]) -> dict[str, str]:
    mine = check_tag_map(body.get("default_tags"), "default_tags")
    return check_tag_map({**parent, **mine}, "default_tags")


def _expiry(parent: float | None, body: dict[str, Any]) -> float | None:
    """A time already past is taken as sent: the sub-key is expired from its creation
    (its status says so), as a document cannot say "in the future" (docs/DECISIONS.md)."""
    if "expires_at" not in body:
        return parent
    expires_at = key_fields.parse_expiry(body["expires_at"])
    if parent is not None and (expires_at is None or expires_at > parent):
        raise _exceeds("expires_at is later than the parent key's expiry.", "expires_at")
    return expires_at
