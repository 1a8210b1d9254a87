"""Key settings read from JSON bodies, shared by the admin API and ``/v1/keys``.

Each reader checks one field and answers 400 ``invalid_request`` naming it (``param``);
whether a valid value is *allowed* (a sub-key inside its parent) is decided elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from gateway.accounts.key_record import CAP_FIELDS, Caps, parse_iso
from gateway.accounts.tool_rules import check_tool_patterns
from gateway.errors import GatewayError

MAX_NAME = 200
#: caps that always hold a positive limit; the others may be null (unlimited) or 0
ALWAYS_LIMITED = ("rpm", "max_in_flight", "max_output_tokens")
USD_CAPS = ("usd_day", "usd_month")
#: the largest amount of money any field takes, in USD, and the largest count
MAX_USD = 1_000_000_000
MAX_COUNT = 2**53 - 1


#: a number written with a zero fraction names one integer exactly up to this magnitude
WHOLE_FLOAT_LIMIT = 2**53


def as_int(value: object) -> int | None:
    """The integer ``value`` is as JSON Schema reads one, or None: written as an integer,
    or with a zero fraction (``10.0``, which JSON Schema's ``integer`` admits and
    schemathesis sends) up to 2**53; never a boolean."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer() and abs(value) <= WHOLE_FLOAT_LIMIT:
        return int(value)
    return None


def number(body: dict[str, Any], name: str, *, integer: bool = False) -> Any:
    """A non-negative number (or integer) field; None when absent or null.

    Bounded: an amount in USD at most ``MAX_USD`` (its nano-USD must fit the store's
    64-bit integers), a count at most ``MAX_COUNT`` (exact in every JSON reader)."""
    value = body.get(name)
    if value is None:
        return None
    if integer:  # written as an integer, or with a zero fraction (10.0)
        value = as_int(value)
    limit = MAX_COUNT if integer else MAX_USD
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= limit:
        kind = "a non-negative integer" if integer else "a non-negative number"
        raise GatewayError(
            "invalid_request", f"{name} must be {kind} of at most {limit:,}.", param=name
        )
    return value


#: the public name of a key's list of allowed models (the spec's GET /v1/key field), taken
#: by the key bodies too, and the name those bodies took first, still accepted
MODEL_LIST = "allowed_model_keys"
MODEL_LIST_ALIAS = "allowed_models"


def model_list_name(body: dict[str, Any]) -> str:
    """The name the body gives its model list: ``allowed_model_keys`` (the name answers
    carry), or ``allowed_models`` (the name bodies took first); errors about the list name
    the field as sent. Sending both names at once is refused."""
    if MODEL_LIST_ALIAS not in body:
        return MODEL_LIST
    if MODEL_LIST in body:
        raise GatewayError(
            "invalid_request",
            f"{MODEL_LIST_ALIAS} is the older name of {MODEL_LIST}: send one of them.",
            param=MODEL_LIST_ALIAS,
        )
    return MODEL_LIST_ALIAS


def refuse_unknown_fields(body: dict[str, Any], allowed: Sequence[str], what: str) -> None:
    """A field the body does not take is refused, not ignored (a typo must not give a
    key without what was asked), naming it and every field the body takes (the older
    name of the model list is read too, not listed)."""
    read = {*allowed, MODEL_LIST_ALIAS} if MODEL_LIST in allowed else set(allowed)
    unknown = sorted(set(body) - read)
    if unknown:
        raise GatewayError(
            "invalid_request",
            f"Unknown field {unknown[0]!r} in {what}; allowed: {', '.join(allowed)}.",
            param=unknown[0],
        )


def string_list(body: dict[str, Any], name: str) -> tuple[str, ...] | None:
    """A list of non-empty strings, duplicates dropped; None when absent or null."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise GatewayError("invalid_request", f"{name} must be a list of strings.", param=name)
    return tuple(dict.fromkeys(value))


def tool_patterns(body: dict[str, Any]) -> tuple[str, ...] | None:
    """``allowed_tools``: MCP tool patterns (``server__tool``, ``server__*``); None when
    absent (every tool of the organisation's servers)."""
    patterns = string_list(body, "allowed_tools")
    return None if patterns is None else check_tool_patterns(patterns, "allowed_tools")


def parse_name(body: dict[str, Any]) -> str:
    """The required key name: a string of 1 to 200 characters (surrounding spaces dropped)."""
    value = body.get("name")
    if not isinstance(value, str) or not value.strip():
        raise GatewayError("invalid_request", "name is required.", param="name")
    if len(value.strip()) > MAX_NAME:
        raise GatewayError(
            "invalid_request", f"name is longer than {MAX_NAME} characters.", param="name"
        )
    return value.strip()


def parse_expiry(value: Any) -> float | None:
    """An ISO 8601 ``expires_at`` as epoch seconds; None stays None."""
    if value is None:
        return None
    try:
        if not isinstance(value, str):
            raise ValueError(value)
        return parse_iso(value)
    except ValueError:
        raise GatewayError(
            "invalid_request", "expires_at must be an ISO 8601 timestamp.", "expires_at"
        ) from None


def parse_caps(raw: Any, base: Caps) -> Caps:
    """Caps from a JSON object; fields left out keep ``base``'s values."""
    if raw is None:
        return base
    if not isinstance(raw, dict):
        raise GatewayError("invalid_request", "caps must be an object.", param="caps")
    values = base.public()
    for field, value in raw.items():
        param = f"caps.{field}"
        if field not in CAP_FIELDS:
            raise GatewayError("invalid_request", f"Unknown cap {field!r}.", param=param)
        integer = field not in USD_CAPS
        checked = number({param: value}, param, integer=integer)
        if checked is None and field in ALWAYS_LIMITED:
            raise GatewayError("invalid_request", f"{param} cannot be unlimited.", param)
        if checked == 0 and field in ALWAYS_LIMITED:
            raise GatewayError("invalid_request", f"{param} must be positive.", param)
        values[field] = checked
    return Caps(**values)


def guardrail_names(
    body: dict[str, Any], configured: Iterable[str], inherited: tuple[str, ...] = ()
) -> tuple[str, ...]:
    """A key's ``guardrails``: the names of ``[[guardrails]]`` tables it adds to its
    organisation's, after those it ``inherited`` from its parent (which it keeps: a
    sub-key may add guardrails, never remove one)."""
    names = string_list(body, "guardrails") or ()
    known = set(configured)
    for name in names:
        if name not in known:
            raise GatewayError(
                "invalid_request",
                f"Unknown guardrail {name!r}; the server's guardrails:"
                f" {', '.join(sorted(known)) or 'none are configured'}.",
                param="guardrails",
            )
    return tuple(dict.fromkeys((*inherited, *names)))
