"""The error catalog holds every code of the spec, with the status and type the spec gives."""

from __future__ import annotations

import re

import pytest

from gateway.errors import CATALOG, GatewayError, error_type, render

# (code, status) pairs read off the spec's Errors tables.
SPEC_CODES = {
    "invalid_request": 400, "unsupported_parameter": 400, "validation_failed": 400,
    "invalid_messages": 400, "invalid_input": 400, "invalid_tags": 400, "missing_tags": 400,
    "max_tokens_exceeds_key_limit": 400, "model_lacks_vision": 400, "model_lacks_tools": 400,
    "model_lacks_structured_output": 400, "web_search_unavailable": 400,
    "connectors_require_user_session": 400, "model_not_zdr": 400, "byok_unavailable": 400,
    "byok_credential_rejected": 400, "child_exceeds_parent": 400, "model_not_in_catalog": 400,
    "key_revoked": 400, "invalid_api_key": 401, "key_cap_exceeded": 402,
    "insufficient_credits": 402, "budget_exceeded": 402, "spend_refused": 402,
    "max_cost_per_request": 402, "scope_denied": 403, "model_not_allowed": 403,
    "model_not_priced": 403, "web_search_not_allowed": 403, "entitlement_denied": 403,
    "model_ambiguous": 403, "model_not_found": 404, "not_found": 404,
    "method_not_allowed": 405, "idempotency_conflict": 409,
    "provider_credential_missing": 409, "duplicate_request": 409,
    "idempotency_key_reused": 422, "rate_limited": 429, "too_many_in_flight": 429,
    "not_implemented": 501, "admission_unavailable": 503, "pricing_unavailable": 503,
    "model_unavailable": 503, "service_unavailable": 503, "request_timeout": 504,
}  # fmt: skip

TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "insufficient_quota",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    501: "api_error",
    503: "api_error",
    504: "api_error",
}


@pytest.mark.parametrize(("code", "status"), sorted(SPEC_CODES.items()))
def test_every_spec_code_is_in_the_catalog(code: str, status: int) -> None:
    assert CATALOG[code].status == status
    body, rendered_status, headers = render(GatewayError(code))
    assert rendered_status == status
    assert f'"type":"{TYPES[status]}"'.encode() in body
    assert headers["Content-Type"] == "application/json"


def test_type_is_derived_from_status() -> None:
    for status, kind in TYPES.items():
        assert error_type(status) == kind


@pytest.mark.parametrize(
    ("code", "retry_after"),
    [("too_many_in_flight", "5"), ("service_unavailable", "1"), ("admission_unavailable", "1")],
)
def test_fixed_retry_after(code: str, retry_after: str) -> None:
    assert render(GatewayError(code))[2]["Retry-After"] == retry_after


@pytest.mark.parametrize(
    "code", ["not_implemented", "pricing_unavailable", "request_timeout", "invalid_request"]
)
def test_not_retryable_codes_carry_no_retry_after(code: str) -> None:
    assert "Retry-After" not in render(GatewayError(code))[2]


# The spec's Retry columns (401, 402, 403, 404, 405 and 422 refusals: not retryable).
RETRYABLE = {"idempotency_conflict": False, "duplicate_request": True, "rate_limited": True,
             "too_many_in_flight": True, "admission_unavailable": True,
             "model_unavailable": True, "service_unavailable": True}  # fmt: skip


@pytest.mark.parametrize("code", sorted(SPEC_CODES))
def test_every_answer_says_whether_to_retry(code: str) -> None:
    """x-should-retry on every error answer; the official SDKs obey it before their own
    rule (which retries every 409, 429 and 5xx)."""
    expected = "true" if RETRYABLE.get(code, False) else "false"
    assert render(GatewayError(code))[2]["x-should-retry"] == expected


@pytest.mark.parametrize(
    ("code", "retryable", "header"),
    [("idempotency_conflict", True, "true"), ("admission_unavailable", False, "false")],
)
def test_one_raise_overrides_its_row(code: str, retryable: bool, header: str) -> None:
    """The in-progress 409 is retryable; the 503 of an incomplete BYOK setup is not, and
    keeps the Retry-After it is raised with."""
    headers = render(GatewayError(code, retry_after=60, retryable=retryable))[2]
    assert (headers["x-should-retry"], headers["Retry-After"]) == (header, "60")
    assert "Retry-After" not in render(GatewayError("admission_unavailable", retryable=False))[2]


def test_unknown_code_is_a_programming_error() -> None:
    with pytest.raises(KeyError):
        GatewayError("no_such_code")


def test_svc_block_is_rendered() -> None:
    error = GatewayError("model_not_found", svc={"policy": {"decisions": []}})
    body = render(error)[0]
    assert re.search(rb'"svc":\{"policy"', body)
