"""The error catalog: every code of the spec in one table, one error class, one renderer.

Each row says the HTTP status, whether a client may retry, and the fixed Retry-After
where the spec gives one. The error ``type`` is derived from the status exactly as the
spec's "Errors / Shape" table says, so no row can disagree with it.

Whether to retry is said on every error answer in ``x-should-retry`` (``true`` or
``false``), which the official SDKs obey before their own rule (retry every 408, 409,
429 and 5xx). The row decides it; a raise overrides it only where the spec makes one
code retryable in one case and not in another (``GatewayError.retryable``): the 409
``idempotency_conflict`` is retryable only while the original is in progress, and the
503 ``admission_unavailable`` of an incomplete BYOK setup is not.

Handlers raise :class:`GatewayError`; the app's error handler turns it into the
wire shape with :func:`render`. Nothing else builds error bodies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, cast

import orjson


@dataclass(frozen=True, slots=True)
class ErrorSpec:
    status: int
    retryable: bool
    retry_after: int | None = None
    message: str = ""


def _spec(status: int, retryable: bool, message: str, retry_after: int | None = None) -> ErrorSpec:
    return ErrorSpec(status=status, retryable=retryable, retry_after=retry_after, message=message)


# code -> (status, retryable, default message, fixed Retry-After)
CATALOG: dict[str, ErrorSpec] = {
    # 400
    "invalid_request": _spec(400, False, "The request is invalid."),
    "unsupported_parameter": _spec(400, False, "This parameter is not supported by this gateway."),
    "validation_failed": _spec(400, False, "The request is missing a required field."),
    "invalid_messages": _spec(
        400, False, "messages must be a non-empty array of objects with role and content."
    ),
    "invalid_input": _spec(400, False, "The input could not be read."),
    "invalid_tags": _spec(400, False, "The tags are malformed."),
    "missing_tags": _spec(400, False, "Required tags are missing."),
    "max_tokens_exceeds_key_limit": _spec(
        400, False, "The output token budget is above this key's limit."
    ),
    "model_lacks_vision": _spec(400, False, "This model cannot read images."),
    "model_lacks_tools": _spec(400, False, "This model does not support tools."),
    "model_lacks_structured_output": _spec(
        400, False, "This model does not support structured output."
    ),
    "web_search_unavailable": _spec(400, False, "This model has no native web search."),
    "connectors_require_user_session": _spec(
        400, False, "Connectors and HITL approvals require a user session."
    ),
    "model_not_zdr": _spec(400, False, "This model is not available under zero retention."),
    "byok_unavailable": _spec(400, False, "This model cannot be billed on your provider key."),
    "byok_credential_rejected": _spec(
        400, False, "The provider refused the organization's provider key."
    ),
    "child_exceeds_parent": _spec(400, False, "A sub-key cannot exceed its parent."),
    "model_not_in_catalog": _spec(400, False, "The model is not in the organization's catalog."),
    "key_revoked": _spec(400, False, "The key is revoked."),
    # guardrails (DESIGN.md): a deny, on the request or on the answer
    "content_blocked": _spec(400, False, "The content was blocked by a guardrail."),
    # 401
    "invalid_api_key": _spec(401, False, "The API key is invalid, revoked or expired."),
    # 402
    "key_cap_exceeded": _spec(402, False, "The key's spend cap would be exceeded."),
    "insufficient_credits": _spec(402, False, "The organization lacks credits for this call."),
    "budget_exceeded": _spec(402, False, "The organization's budget for the period is exhausted."),
    "spend_refused": _spec(402, False, "The organization's spend controls refused the call."),
    "max_cost_per_request": _spec(
        402, False, "The worst-case cost is above the contract's per-request maximum."
    ),
    # 403
    "scope_denied": _spec(403, False, "The key lacks the scope for this endpoint."),
    "model_not_allowed": _spec(403, False, "The model is not allowed for this key."),
    "model_not_priced": _spec(403, False, "The model has no price yet."),
    "web_search_not_allowed": _spec(
        403, False, "Web search is not available for this model in the organization."
    ),
    "entitlement_denied": _spec(403, False, "The organization's plan does not allow this call."),
    "model_ambiguous": _spec(403, False, "The model id does not resolve to a single model."),
    # 404
    "model_not_found": _spec(404, False, "The model does not exist or is unavailable."),
    "not_found": _spec(404, False, "Not found."),
    # 405
    "method_not_allowed": _spec(405, False, "Method not allowed on this path."),
    # 408 (a request body that did not arrive in time: [server] body_timeout_s)
    "request_body_timeout": _spec(408, True, "The request body did not arrive in time."),
    # 409 (idempotency_conflict: retryable when raised for an original still in progress)
    "idempotency_conflict": _spec(409, False, "The Idempotency-Key is in conflict."),
    "provider_credential_missing": _spec(
        409, False, "No provider key is set up for this model's provider."
    ),
    "duplicate_request": _spec(409, True, "The request id is already used."),
    # 413 (DESIGN.md: body size limit)
    "request_too_large": _spec(413, False, "The request body is too large."),
    # 422
    "idempotency_key_reused": _spec(
        422, False, "The Idempotency-Key was used with a different body."
    ),
    # 429
    "rate_limited": _spec(429, True, "Rate limit exceeded."),
    "too_many_in_flight": _spec(429, True, "Too many calls in flight for this key.", 5),
    # 5xx
    "not_implemented": _spec(501, False, "Confidential data mode is not available."),
    "admission_unavailable": _spec(  # not retryable when raised for an incomplete BYOK setup
        503, True, "An admission check could not complete."
    ),
    "pricing_unavailable": _spec(503, False, "No price is configured for the organization."),
    "model_unavailable": _spec(503, True, "The model is temporarily unavailable."),
    "service_unavailable": _spec(503, True, "The model is unreachable."),
    "request_timeout": _spec(504, False, "The call ran out of time; retry with stream true."),
    "internal_error": _spec(500, True, "The service failed unexpectedly."),
    # MCP (gateway/tools/): JSON-RPC errors whose data is the error object
    "tool_not_allowed": _spec(403, False, "The key may not call this tool."),
    "tool_not_found": _spec(404, False, "No such tool behind this gateway."),
}

# Default Retry-After for retryable 5xx codes (the spec says "after Retry-After").
DEFAULT_5XX_RETRY_AFTER = 1
# The answer header of the official SDKs' retry rule ("true" or "false").
SHOULD_RETRY = "x-should-retry"


def retry_hint(retryable: bool) -> dict[str, str]:
    """The ``x-should-retry`` header saying whether a retry can succeed."""
    return {SHOULD_RETRY: "true" if retryable else "false"}


#: the spec's error.type of each status; every other status is an api_error
ERROR_TYPES = {
    **dict.fromkeys((400, 405, 408, 413, 422), "invalid_request_error"),
    401: "authentication_error",
    402: "insufficient_quota",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    429: "rate_limit_error",
}


def error_type(status: int) -> str:
    """The spec's error.type, derived from the status alone."""
    return ERROR_TYPES.get(status, "api_error")


#: Anthropic's error.type by status (the Messages endpoint's dialect); the rest as
#: :data:`ERROR_TYPES` says, a 503 by whether a retry can succeed (:func:`anthropic_type`)
ANTHROPIC_TYPES = {
    402: "billing_error",
    409: "invalid_request_error",
    413: "request_too_large",
    504: "timeout_error",
}


def anthropic_type(status: int, retryable: bool) -> str:
    """Anthropic's error.type: its SDKs pick the exception class by status, the type says
    what happened (a retryable 503 is the upstream's overload, Anthropic's 529)."""
    if status == 503:
        return "overloaded_error" if retryable else "api_error"
    return ANTHROPIC_TYPES.get(status) or error_type(status)


@dataclass
class GatewayError(Exception):
    """A refusal with a catalog code; ``svc`` holds the extension block where the spec wants it.

    ``retryable`` overrides the catalog row for this one answer (None: the row decides).
    """

    code: str
    message: str | None = None
    param: str | None = None
    retry_after: int | None = None
    svc: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    retryable: bool | None = None

    def __post_init__(self) -> None:
        if self.code not in CATALOG:
            raise KeyError(f"unknown error code {self.code!r}")
        Exception.__init__(self, self.code)

    @property
    def spec(self) -> ErrorSpec:
        return CATALOG[self.code]

    @property
    def status(self) -> int:
        return self.spec.status

    @property
    def should_retry(self) -> bool:
        return self.spec.retryable if self.retryable is None else self.retryable

    def body(self) -> dict[str, Any]:
        spec = self.spec
        payload: dict[str, Any] = {
            "error": {
                "message": self.message or spec.message,
                "type": error_type(spec.status),
                "code": self.code,
                "param": self.param,
            }
        }
        if self.svc is not None:
            payload["svc"] = self.svc
        return payload

    def anthropic_body(self) -> dict[str, Any]:
        """The body in Anthropic's dialect: ``{"type": "error", "error": {...}}`` with the
        spec's code and param kept inside ``error``, the svc block where the spec has it."""
        members = self.body()
        error = members.pop("error")
        error["type"] = anthropic_type(self.status, self.should_retry)
        return {"type": "error", "error": error, **members}

    def response_headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        retry_after = self.retry_after if self.retry_after is not None else self.spec.retry_after
        if retry_after is None and self.status >= 500 and self.should_retry:
            retry_after = DEFAULT_5XX_RETRY_AFTER
        if retry_after is not None:
            headers["Retry-After"] = str(retry_after)
        headers.update(retry_hint(self.should_retry))
        return headers


def render(
    error: GatewayError, dialect: Literal["openai", "anthropic"] = "openai"
) -> tuple[bytes, int, dict[str, str]]:
    """Body, status and headers of an error answer, in the dialect of the request's path."""
    headers = error.response_headers()
    headers["Content-Type"] = "application/json"
    body = error.anthropic_body() if dialect == "anthropic" else error.body()
    return orjson.dumps(body), error.status, headers


def in_band(error: GatewayError) -> dict[str, Any]:
    """The error members carried inside a stream (message, type, code, param)."""
    return cast(dict[str, Any], error.body()["error"])
