"""Step 6 of the request walk: may this key call this model, and through which credential.

Checks, in order (the first failing group answers):

1. the model exists in the catalog, else 404 model_not_found (decision unknown_model);
2. it is of the endpoint's kind (chat or embedding), else 400 invalid_request / model;
3. policy rules: every rule of the organisation, its contract and the key that denies is
   listed in ``svc.policy.decisions`` of one 403 model_not_allowed;
4. data mode: confidential is 501 not_implemented; zero_retention needs a model with
   zero_retention_available (400 model_not_zdr);
5. BYOK: the model must allow it (400 byok_unavailable), the organisation must have a
   credential for the provider (409 provider_credential_missing) and BYOK pricing
   (503 admission_unavailable, Retry-After 60);
6. a price (403 model_not_priced).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gateway.catalog import Model
from gateway.errors import GatewayError
from gateway.keys import KeyRecord
from gateway.orgs import Org

if TYPE_CHECKING:
    from gateway.runtime import Runtime

BYOK_SETUP_RETRY_AFTER = 60


def _deny(rule: str) -> dict[str, str]:
    return {"rule": rule, "verdict": "deny"}


def _listed(policy: dict[str, Any], name: str) -> list[str] | None:
    value = policy.get(name)
    return value if isinstance(value, list) else None


def org_rules(runtime: Runtime, org: Org | None, model: Model) -> list[dict[str, str]]:
    """Decisions of the organisation's and the contract's rules that deny ``model``."""
    if org is None:
        return []
    policy = org.policy
    provider = model.config.provider
    checks: list[tuple[str, Callable[[], bool]]] = [
        (
            "contract_blocked_models",
            lambda: model.id in (_listed(policy, "contract_blocked_models") or []),
        ),
        (
            "contract_allowed_models",
            lambda: (
                (allowed := _listed(policy, "contract_allowed_models")) is not None
                and model.id not in allowed
            ),
        ),
        (
            "contract_allowed_providers",
            lambda: (
                (allowed := _listed(policy, "contract_allowed_providers")) is not None
                and provider not in allowed
            ),
        ),
        ("residency", lambda: not runtime.serves_residency(provider, org.residency)),
        (
            "org_api_restriction",
            lambda: (
                (allowed := _listed(policy, "org_api_models")) is not None
                and model.id not in allowed
            ),
        ),
        (
            "org_api_disabled",
            lambda: model.kind in (_listed(policy, "org_api_disabled_kinds") or []),
        ),
    ]
    return [_deny(rule) for rule, denies in checks if denies()]


def key_rules(runtime: Runtime, record: KeyRecord, model: Model) -> list[dict[str, str]]:
    """key_allowed_models, for the key and (narrowing, never widening) its parent."""
    lists = [record.allowed_models]
    if record.parent_id:
        parent = runtime.keyring.get(record.parent_id)
        lists.append(parent.allowed_models if parent else None)
    if any(allowed is not None and model.id not in allowed for allowed in lists):
        return [_deny("key_allowed_models")]
    return []


def check_model(runtime: Runtime, record: KeyRecord, model_id: str, kind: str) -> Model:
    model = runtime.catalog.get(model_id)
    if model is None:
        raise GatewayError(
            "model_not_found",
            f"The model {model_id!r} does not exist or is not available to your organization.",
            param="model",
            svc={"policy": {"decisions": [_deny("unknown_model")]}},
        )
    if model.kind != kind:
        expected = "an embedding" if kind == "embedding" else "a chat"
        raise GatewayError("invalid_request", f"{model_id} is not {expected} model.", "model")
    org = runtime.orgs.get(record.org_id)
    decisions = org_rules(runtime, org, model) + key_rules(runtime, record, model)
    if decisions:
        rules = ", ".join(d["rule"] for d in decisions)
        raise GatewayError(
            "model_not_allowed",
            f"The model {model_id!r} is not allowed ({rules}).",
            param="model",
            svc={"policy": {"decisions": decisions}},
        )
    if record.data_mode == "confidential":
        raise GatewayError(
            "not_implemented", "Confidential data mode is not available.", param=None
        )
    if record.data_mode == "zero_retention" and not model.config.zero_retention_available:
        raise GatewayError(
            "model_not_zdr", f"{model_id} is not available under zero retention.", "model"
        )
    if record.byok:
        _check_byok(runtime, org, model)
    if not model.priced:
        raise GatewayError("model_not_priced", f"{model_id} has no price yet.", "model")
    return model


def _check_byok(runtime: Runtime, org: Org | None, model: Model) -> None:
    if not model.config.byok_available:
        raise GatewayError(
            "byok_unavailable", f"{model.id} cannot be billed on your provider key.", "model"
        )
    if org is None or runtime.byok_env(org.id, model.config.provider) is None:
        raise GatewayError(
            "provider_credential_missing",
            f"No provider key is set up for provider {model.config.provider!r}.",
            "model",
        )
    if not isinstance(org.policy.get("byok_pricing"), dict):
        raise GatewayError(
            "admission_unavailable",
            "BYOK pricing is not set up for this organization.",
            retry_after=BYOK_SETUP_RETRY_AFTER,
        )


def callable_models(runtime: Runtime, record: KeyRecord) -> list[Model]:
    """The organisation's catalog as this key sees it: models no org or contract rule denies."""
    org = runtime.orgs.get(record.org_id)
    return [m for m in runtime.catalog.models.values() if not org_rules(runtime, org, m)]
