"""Organisations: their record, their policy document and its validation."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from gateway.accounts.key_fields import MAX_USD
from gateway.accounts.tool_rules import check_tool_patterns
from gateway.config.settings import MAX_PRICE
from gateway.errors import GatewayError

# Policy file keys of the operator contract (DESIGN.md), with the JSON type each takes.
POLICY_KEYS: dict[str, type | tuple[type, ...]] = {
    "contract_allowed_models": list,
    "contract_blocked_models": list,
    "contract_allowed_providers": list,
    "org_api_models": list,
    "org_api_disabled_kinds": list,
    "max_cost_per_request_usd": (int, float),
    "budget_usd_month": (int, float),
    "entitlements": dict,
    "byok_pricing": dict,
    "org_rpm": int,
    "web_search_models": list,
    "spend_paused": bool,
    # the [[guardrails]] (by name) on every call of the organisation's keys
    "guardrails": list,
    # MCP: tool patterns (server__tool, server__*) no key of the organisation may call
    "org_blocked_tools": list,
}

#: features an organisation's plan (policy key ``entitlements``) can turn off
ENTITLEMENTS = (
    "chat_completions",
    "responses",
    "messages",
    "embeddings",
    "streaming",
    "tools",
    "vision",
    "structured_output",
    "web_search",
    "live",
)
_PRICE_FIELDS = ("input_usd_per_mtok", "output_usd_per_mtok")
#: optional in a BYOK price: absent, cached tokens cost its input price
_CACHE_PRICE_FIELDS = ("cache_read_usd_per_mtok", "cache_write_usd_per_mtok")


@dataclass(frozen=True, slots=True)
class Org:
    id: str
    name: str
    residency: str | None = None
    policy: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0

    def to_row(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Org:
        return cls(
            id=row["id"],
            name=row["name"],
            residency=row.get("residency"),
            policy=row.get("policy") or {},
            created_at=row["created_at"],
        )

    def with_policy(self, policy: dict[str, Any]) -> Org:
        return replace(self, policy=policy)


def validate_policy(policy: Any) -> dict[str, Any]:
    """Check a policy document; refuse unknown keys and wrong types with invalid_request."""
    if not isinstance(policy, dict):
        raise GatewayError("invalid_request", "The policy must be a JSON object.", param="policy")
    for key, value in policy.items():
        kind = POLICY_KEYS.get(key)
        if kind is None:
            raise GatewayError(
                "invalid_request",
                f"Unknown policy key {key!r}; allowed: {', '.join(POLICY_KEYS)}.",
                param=key,
            )
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool) != (kind is bool) or not isinstance(value, kinds):
            raise GatewayError(
                "invalid_request", f"Policy key {key!r} has the wrong type.", param=key
            )
        if isinstance(value, list) and not all(isinstance(item, str) for item in value):
            raise GatewayError(
                "invalid_request", f"Policy key {key!r} must list strings.", param=key
            )
        if isinstance(value, (int, float)) and not 0 <= value <= MAX_USD:
            raise GatewayError(
                "invalid_request",
                f"Policy key {key!r} must be between 0 and {MAX_USD:,}.",
                param=key,
            )
    check_tool_patterns(policy.get("org_blocked_tools") or [], "org_blocked_tools")
    _check_entitlements(policy.get("entitlements"))
    _check_byok_pricing(policy.get("byok_pricing"))
    return dict(policy)


def _check_entitlements(plan: dict[str, Any] | None) -> None:
    for feature, allowed in (plan or {}).items():
        if feature not in ENTITLEMENTS:
            raise GatewayError(
                "invalid_request",
                f"Unknown entitlement {feature!r}; known: {', '.join(ENTITLEMENTS)}.",
                param="entitlements",
            )
        if not isinstance(allowed, bool):
            raise GatewayError(
                "invalid_request", f"Entitlement {feature!r} must be a boolean.", "entitlements"
            )


def _check_byok_pricing(pricing: dict[str, Any] | None) -> None:
    """``{model id or "*": {"input_usd_per_mtok": n, "output_usd_per_mtok": n}}``, each
    price with ``cache_read_usd_per_mtok`` and ``cache_write_usd_per_mtok`` if wanted
    (absent: cached tokens at its input price)."""
    for model_id, price in (pricing or {}).items():
        valid = isinstance(price, dict) and set(_PRICE_FIELDS) <= set(price)
        valid = valid and set(price) <= {*_PRICE_FIELDS, *_CACHE_PRICE_FIELDS}
        valid = valid and all(
            isinstance(price[f], (int, float))
            and not isinstance(price[f], bool)
            and 0 <= price[f] <= MAX_PRICE
            for f in price
        )
        if not valid:
            raise GatewayError(
                "invalid_request",
                f"byok_pricing[{model_id!r}] must hold input_usd_per_mtok and "
                "output_usd_per_mtok, and may hold cache_read_usd_per_mtok and "
                f"cache_write_usd_per_mtok: numbers from 0 to {MAX_PRICE:,}.",
                param="byok_pricing",
            )
