"""Step 6 of the request walk: may this key call this model, and through which credential.

Checks, in order (the first failing group answers):

1. the name is a model of the catalog or an alias of exactly one, else 404
   model_not_found (decision unknown_model) or 403 model_ambiguous; a model switched
   off by the operator is 503 model_unavailable;
2. it is of the endpoint's kind (chat or embedding), else 400 invalid_request / model;
3. policy rules: every rule of the organisation, its contract and the key that denies is
   listed in ``svc.policy.decisions`` of one 403 model_not_allowed;
4. data mode: confidential is 501 not_implemented; zero_retention needs a model with
   zero_retention_available (400 model_not_zdr);
5. BYOK: the model must allow it (400 byok_unavailable), the organisation must have a
   credential for the provider (409 provider_credential_missing) and BYOK pricing
   (503 admission_unavailable, Retry-After 60) with a price for this model (503
   pricing_unavailable); the call is then costed at that price;
6. a price (403 model_not_priced).

Checks that need the parsed call (entitlements, web search) and the per-request cost
ceiling are separate functions the walk calls where it has what they need; they read
only the organisation's rules. The model checks read a :class:`PolicySource`: the
catalog, the organisations, the keys, the providers' zones and the BYOK credentials
(the server's runtime is one).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from gateway.accounts.catalog import Catalog, Model, nanos_to_usd, usd_to_nanos
from gateway.accounts.key_record import KeyRecord
from gateway.accounts.orgs import Org
from gateway.accounts.usd_json import plain_usd
from gateway.calls.estimate import LOWER_IT
from gateway.config.settings import DeploymentConfig
from gateway.errors import GatewayError

BYOK_SETUP_RETRY_AFTER = 60


class Keys(Protocol):
    def get(self, key_id: str) -> KeyRecord | None: ...


class PolicySource(Protocol):
    """What the model checks read."""

    @property
    def catalog(self) -> Catalog: ...
    @property
    def orgs(self) -> Mapping[str, Org]: ...
    @property
    def keyring(self) -> Keys: ...
    def serves_residency(self, provider: str, residency: str | None) -> bool: ...
    def byok_env(self, org_id: str, provider: str) -> str | None: ...
    def zero_retention(self, provider: str) -> bool: ...


def _deny(rule: str) -> dict[str, str]:
    return {"rule": rule, "verdict": "deny"}


def _listed(policy: dict[str, Any], name: str) -> list[str] | None:
    value = policy.get(name)
    return value if isinstance(value, list) else None


def org_rules(runtime: PolicySource, org: Org | None, model: Model) -> list[dict[str, str]]:
    """Decisions of the organisation's and the contract's rules that deny ``model``."""
    if org is None:
        return []
    policy = org.policy
    providers = [d.provider for d in model.config.routes()]
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
            lambda: not any(_provider_allowed(org, p) for p in providers),
        ),
        (
            "residency",
            lambda: not any(runtime.serves_residency(p, org.residency) for p in providers),
        ),
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


def _provider_allowed(org: Org, provider: str) -> bool:
    allowed = _listed(org.policy, "contract_allowed_providers")
    return allowed is None or provider in allowed


def open_deployments(
    runtime: PolicySource, record: KeyRecord, model: Model
) -> list[tuple[int, DeploymentConfig]]:
    """The deployments of ``model`` (with their index) that may serve this key: a model
    the key may call is served only by deployments the same rules allow, so routing
    never widens access. A deployment is closed by the contract's providers, the
    organisation's residency, a zero-retention key on a provider without the agreement,
    and a BYOK key on a provider the organisation has no credential for."""
    org = runtime.orgs.get(record.org_id)
    found = []
    for index, deployment in enumerate(model.config.routes()):
        provider = deployment.provider
        if org is not None and not (
            _provider_allowed(org, provider) and runtime.serves_residency(provider, org.residency)
        ):
            continue
        if record.data_mode == "zero_retention" and not runtime.zero_retention(provider):
            continue
        if record.byok and not _byok_credential(runtime, org, provider):
            continue
        found.append((index, deployment))
    return found


def _byok_credential(runtime: PolicySource, org: Org | None, provider: str) -> bool:
    """The organisation has a BYOK credential for ``provider`` that this server holds."""
    env = runtime.byok_env(org.id, provider) if org is not None else None
    return env is not None and bool(os.environ.get(env))


def key_rules(runtime: PolicySource, record: KeyRecord, model: Model) -> list[dict[str, str]]:
    """key_allowed_models, for the key and (narrowing, never widening) its parent."""
    lists = [record.allowed_models]
    if record.parent_id:
        parent = runtime.keyring.get(record.parent_id)
        lists.append(parent.allowed_models if parent else None)
    if any(allowed is not None and model.id not in allowed for allowed in lists):
        return [_deny("key_allowed_models")]
    return []


def check_model(runtime: PolicySource, record: KeyRecord, model_id: str, kind: str) -> Model:
    model = _find(runtime, model_id)
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
        return _check_byok(runtime, org, model, record)
    if not model.priced:
        raise GatewayError("model_not_priced", f"{model_id} has no price yet.", "model")
    return model


def _find(runtime: PolicySource, name: str) -> Model:
    """The one model a requested name means, or the refusal saying why there is none."""
    candidates = runtime.catalog.candidates(name)
    if len(candidates) > 1:
        raise GatewayError(
            "model_ambiguous",
            f"{name!r} names several models ({', '.join(candidates)}); use one of their ids.",
            param="model",
        )
    if candidates and runtime.catalog.is_disabled(candidates[0]):
        raise GatewayError(
            "model_unavailable", f"The model {name!r} is temporarily disabled.", param="model"
        )
    model = runtime.catalog.get(candidates[0]) if candidates else None
    if model is None:
        raise model_not_found(name)
    return model


def model_not_found(name: str) -> GatewayError:
    """The 404 of a model the caller cannot see, with the decision the spec gives it."""
    return GatewayError(
        "model_not_found",
        f"The model {name!r} does not exist or is not available to your organization.",
        param="model",
        svc={"policy": {"decisions": [_deny("unknown_model")]}},
    )


def _check_byok(runtime: PolicySource, org: Org | None, model: Model, record: KeyRecord) -> Model:
    """The BYOK checks; the model priced at the organisation's BYOK price."""
    if not model.config.byok_available:
        raise GatewayError(
            "byok_unavailable", f"{model.id} cannot be billed on your provider key.", "model"
        )
    if org is None or not open_deployments(runtime, record, model):
        # no credential set up, or one naming an environment variable this server lacks:
        # the provider must never be called without the organisation's key
        raise GatewayError(
            "provider_credential_missing",
            f"No provider key is set up for provider {model.config.provider!r}.",
            "model",
        )
    pricing = org.policy.get("byok_pricing")
    if not isinstance(pricing, dict):
        raise GatewayError(
            "admission_unavailable",
            "BYOK pricing is not set up for this organization.",
            retry_after=BYOK_SETUP_RETRY_AFTER,
            retryable=False,  # the spec: Retry-After 60, though retrying cannot succeed
        )
    price = pricing.get(model.id, pricing.get("*"))
    if price is None:
        raise GatewayError(
            "pricing_unavailable", f"No BYOK price is configured for {model.id}.", "model"
        )
    return model.priced_at(
        price["input_usd_per_mtok"],
        price["output_usd_per_mtok"],
        price.get("cache_read_usd_per_mtok"),
        price.get("cache_write_usd_per_mtok"),
    )


def check_entitlements(org: Org | None, record: KeyRecord, features: list[str]) -> None:
    """403 entitlement_denied for the first feature the organisation's plan turns off.

    ``entitlements`` maps a feature to false to deny it; a feature left out is allowed.
    ``live`` is the plan's paid calls: every call of a live key needs it.
    """
    plan = org.policy.get("entitlements") if org else None
    if not isinstance(plan, dict):
        return
    for feature in features + ["live"] * (record.mode == "live"):
        if plan.get(feature) is False:
            raise GatewayError(
                "entitlement_denied",
                f"Your organization's plan does not include {feature}.",
                param=None,
            )


def check_web_search(org: Org | None, model: Model, param: str) -> None:
    """403 web_search_not_allowed: the model searches, but not for this organisation."""
    allowed = _listed(org.policy, "web_search_models") if org else None
    if allowed is not None and model.id not in allowed:
        raise GatewayError(
            "web_search_not_allowed",
            f"Web search is not available for {model.id} in your organization.",
            param=param,
        )


def check_spend_controls(org: Org | None, record: KeyRecord, cost_nanos: int) -> None:
    """The organisation's spend controls on one call's worst-case cost (before reserving).

    ``spend_paused`` refuses every live call (402 spend_refused: sandbox calls cost
    nothing); ``max_cost_per_request_usd`` refuses a call whose worst case passes it
    (402 max_cost_per_request, with the contract rule in the svc block).
    """
    if org is None:
        return
    if org.policy.get("spend_paused") is True and record.mode == "live":
        raise GatewayError(
            "spend_refused", "Your organization's spend controls paused paid calls.", None
        )
    ceiling = org.policy.get("max_cost_per_request_usd")
    if ceiling is not None and cost_nanos > usd_to_nanos(ceiling):
        raise GatewayError(
            "max_cost_per_request",
            f"The worst-case cost of this call (${plain_usd(nanos_to_usd(cost_nanos))}) is"
            f" above the contract's maximum of ${ceiling} per request; {LOWER_IT}.",
            param=None,
            svc={"policy": {"decisions": [_deny("contract_max_cost_per_request")]}},
        )


def callable_models(runtime: PolicySource, record: KeyRecord) -> list[Model]:
    """The organisation's catalog as this key sees it: models no org or contract rule denies."""
    return org_models(runtime, record.org_id)


def org_models(runtime: PolicySource, org_id: str) -> list[Model]:
    """The organisation's catalog (every key of it sees the same; the dashboard shows it)."""
    org = runtime.orgs.get(org_id)
    return [m for m in runtime.catalog.models.values() if not org_rules(runtime, org, m)]
