"""HTML forms read into the JSON bodies the admin API takes, so that the same checks
(:mod:`gateway.accounts.key_actions`, :mod:`gateway.accounts.key_fields`) decide; only
what a form cannot say as JSON (numbers, lists, tag maps as text) is read here, with the
field named on error."""

from __future__ import annotations

import re
from typing import Any

from werkzeug.datastructures import MultiDict

from gateway.accounts.key_record import CAP_FIELDS, Caps
from gateway.errors import GatewayError

USD_CAPS = ("usd_day", "usd_month")
#: each cap field and its label, in the order the forms show them
CAP_LABELS = {
    "usd_day": "USD a day",
    "usd_month": "USD a month",
    "rpm": "Requests a minute",
    "tpm": "Tokens a minute",
    "max_in_flight": "Calls in flight",
    "max_output_tokens": "Output tokens a call",
}
_SEPARATORS = re.compile(r"[\s,]+")


def _cap(field: str, text: str) -> int | float:
    try:
        return float(text) if field in USD_CAPS else int(text)
    except ValueError:
        kind = "an amount in USD" if field in USD_CAPS else "a whole number"
        raise GatewayError(
            "invalid_request", f"{field} must be {kind}.", param=f"caps.{field}"
        ) from None


def caps(form: MultiDict[str, str]) -> dict[str, Any]:
    """The caps fields of a form. A blank field means the same on the create and the edit
    form: the default (:class:`Caps`'s), which is no cap for the spend caps and tokens a
    minute, and a number for the caps that are always limited."""
    defaults = Caps().public()
    out: dict[str, Any] = {}
    for field in CAP_FIELDS:
        text = form.get(f"caps.{field}", "").strip()
        out[field] = _cap(field, text) if text else defaults[field]
    return out


def blank_means() -> dict[str, str]:
    """What a blank caps field means, per field, as both forms say it."""
    return {
        field: "no cap" if default is None else f"the default, {default:,}"
        for field, default in Caps().public().items()
    }


def tag_map(text: str, param: str) -> dict[str, str]:
    """``k=v`` pairs, one a line or separated by commas; ``k=`` requires any value."""
    tags: dict[str, str] = {}
    for pair in filter(None, (p.strip() for p in re.split(r"[\n,]", text))):
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise GatewayError("invalid_request", f"Write tags as key=value, not {pair!r}.", param)
        tags[name.strip()] = value.strip()
    return tags


def key_body(form: MultiDict[str, str]) -> dict[str, Any]:
    """The body of ``POST /admin/keys`` (without ``org_id``) that a create form says."""
    body: dict[str, Any] = {
        "name": form.get("name", ""),
        "mode": form.get("mode", ""),
        "environment": form.get("environment", ""),
        "data_mode": form.get("data_mode", ""),
        "scopes": form.getlist("scopes"),
        "keys_manage": form.get("keys_manage") == "on",
        "byok": form.get("byok") == "on",
        "caps": caps(form),
        "required_tags": tag_map(form.get("required_tags", ""), "required_tags"),
        "default_tags": tag_map(form.get("default_tags", ""), "default_tags"),
    }
    models = [m for m in _SEPARATORS.split(form.get("allowed_models", "")) if m]
    if models:
        body["allowed_models"] = models
    if expires := form.get("expires_at", "").strip():
        body["expires_at"] = expires
    return body
