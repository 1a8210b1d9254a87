"""The OpenAPI 3.1 document of every /v1 endpoint, built from the routes' own tables.

Error answers come from the error catalog (:mod:`gateway.errors`): each operation lists
the codes it can answer, grouped by the status the catalog gives them, so a code that
moves to another status moves here too. ``tests/edge/test_openapi.py`` checks that every /v1
route of the app is described and that the document is valid OpenAPI 3.1.
"""

from __future__ import annotations

import re
from collections import defaultdict
from functools import cache
from typing import Any

from gateway import __version__
from gateway.accounts.key_record import DATA_MODES, ENVIRONMENTS, KEY_STATUSES, SCOPES, id_pattern
from gateway.edge.request_schemas import (
    CHAT_REQUEST,
    COUNT_TOKENS_REQUEST,
    EMBEDDINGS_REQUEST,
    IDEMPOTENCY_HEADER,
    KEYS_QUERY,
    MESSAGES_REQUEST,
    RESPONSES_REQUEST,
    SUB_KEY_PATCH,
    SUB_KEY_REQUEST,
    TAG_MAP,
    TAGS_HEADER,
    USAGE_QUERY,
    obj,
    path_param,
    query,
)
from gateway.errors import CATALOG, SHOULD_RETRY, error_type, retry_hint

JSON = "application/json"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


STRING = {"type": "string"}
COUNT = {"type": "integer", "minimum": 0}
USD = {"type": "number", "minimum": 0}
USD_OR_NULL = {"type": ["number", "null"], "minimum": 0}
TIMESTAMP = {"type": "string", "format": "date-time"}
TIMESTAMP_OR_NULL = {"type": ["string", "null"], "format": "date-time"}
#: the token counts of a request record's usage, and of usage totals
CACHE_COUNTS = {
    "cached_input_tokens": {
        **COUNT,
        "description": "Part of input_tokens read from the provider's prompt cache.",
    },
    "cache_write_tokens": {
        **COUNT,
        "description": "Part of input_tokens written to the provider's prompt cache.",
    },
}
USAGE_TOTALS = {
    "requests": COUNT,
    "input_tokens": COUNT,
    "output_tokens": COUNT,
    **CACHE_COUNTS,
    "cost_usd": USD,
    "settled_usd": USD,
}

KEY = {
    "object": {"const": "api_key"},
    "id": {"type": "string", "pattern": id_pattern("key")},
    "name": STRING,
    "prefix": STRING,
    "status": {"enum": list(KEY_STATUSES)},
    "mode": {"enum": ["live", "sandbox"]},
    "environment": {"enum": list(ENVIRONMENTS)},
    "data_mode": {"enum": list(DATA_MODES)},
    "scopes": {"type": "array", "items": {"enum": list(SCOPES)}},
    "allowed_model_keys": {"type": ["array", "null"], "items": STRING},
    "allowed_tools": {"type": ["array", "null"], "items": STRING},
    "caps": _ref("Caps"),
    "required_tags": TAG_MAP,
    "default_tags": TAG_MAP,
    "guardrails": {
        "type": "array",
        "items": STRING,
        "description": "Guardrails this key adds to its organisation's (a sub-key keeps its"
        " parent's).",
    },
    "expires_at": TIMESTAMP_OR_NULL,
    "last_used_at": TIMESTAMP_OR_NULL,
    "created_at": TIMESTAMP,
    "byok": {"type": "boolean"},
    "parent_id": {"type": ["string", "null"]},
    "org_id": STRING,
}
#: an error answer's ``error`` member, in OpenAI's shape and in Anthropic's alike
ERROR_OBJECT = obj(
    {
        "message": STRING,
        "type": STRING,
        "code": {"type": "string", "enum": sorted(CATALOG)},
        "param": {"type": ["string", "null"]},
    },
    ("message", "type", "code", "param"),
)

# Answers: the members a client can rely on are required; the objects stay open (the spec
# lets answers grow: "further fields").
SCHEMAS: dict[str, Any] = {
    "Error": obj({"error": ERROR_OBJECT, "svc": _ref("Svc")}, ("error",)),
    "Svc": obj(
        {
            "request_id": {"type": "string", "pattern": id_pattern("req")},
            "policy": obj(
                {
                    "decisions": {
                        "type": "array",
                        "items": obj(
                            {"rule": STRING, "verdict": {"const": "deny"}}, ("rule", "verdict")
                        ),
                    }
                }
            ),
            "ignored_parameters": {"type": "array", "items": STRING},
            "fallback_model": {
                "type": "string",
                "description": "The fallback model that served the call (the model"
                " asked for failed before its first byte); the answer's model names it too.",
            },
        }
    ),
    "ChatCompletionRequest": CHAT_REQUEST,
    "MessagesRequest": MESSAGES_REQUEST,
    "CountTokensRequest": COUNT_TOKENS_REQUEST,
    "Message": obj(
        {
            "id": {"type": "string", "pattern": "^msg_"},
            "type": {"const": "message"},
            "role": {"const": "assistant"},
            "model": STRING,
            "content": {
                "type": "array",
                "items": {
                    "anyOf": [
                        obj({"type": {"const": "text"}, "text": STRING}, ("type", "text")),
                        obj(
                            {
                                "type": {"const": "tool_use"},
                                "id": STRING,
                                "name": STRING,
                                "input": {"type": "object"},
                            },
                            ("type", "id", "name", "input"),
                        ),
                        # relayed from an anthropic deployment as it sent them
                        # (thinking, redacted_thinking, server tool blocks, ...)
                        obj({"type": STRING}, ("type",)),
                    ]
                },
            },
            "stop_reason": {
                "enum": [
                    "end_turn",
                    "max_tokens",
                    "stop_sequence",
                    "tool_use",
                    "refusal",
                    "pause_turn",
                    "model_context_window_exceeded",
                ]
            },
            "stop_sequence": {"type": ["string", "null"]},
            "usage": obj(
                {
                    "input_tokens": COUNT,
                    "output_tokens": COUNT,
                    "cache_read_input_tokens": COUNT,
                    "cache_creation_input_tokens": COUNT,
                },
                ("input_tokens", "output_tokens"),
            ),
            "svc": _ref("Svc"),
        },
        ("id", "type", "role", "model", "content", "stop_reason", "usage"),
    ),
    "MessageTokensCount": obj({"input_tokens": COUNT}, ("input_tokens",)),
    "AnthropicError": obj(
        {
            "type": {"const": "error"},
            "error": ERROR_OBJECT,
            "svc": _ref("Svc"),
        },
        ("type", "error"),
    ),
    "ResponsesRequest": RESPONSES_REQUEST,
    "EmbeddingsRequest": EMBEDDINGS_REQUEST,
    "SubKeyCreate": SUB_KEY_REQUEST,
    "SubKeyPatch": SUB_KEY_PATCH,
    "Caps": obj(
        {
            "usd_day": USD_OR_NULL,
            "usd_month": USD_OR_NULL,
            "rpm": COUNT,
            "tpm": {"type": ["integer", "null"], "minimum": 0},
            "max_in_flight": COUNT,
            "max_output_tokens": COUNT,
        },
        ("usd_day", "usd_month", "rpm", "tpm", "max_in_flight", "max_output_tokens"),
    ),
    "Key": obj(KEY, tuple(KEY)),  # every member, always
    "SpendWindow": obj(
        {
            "spent_usd": USD,
            "reserved_usd": USD,
            "limit_usd": USD_OR_NULL,
            "remaining_usd": {"type": ["number", "null"]},
            "resets_at": TIMESTAMP,
        },
        ("spent_usd", "reserved_usd", "limit_usd", "remaining_usd", "resets_at"),
    ),
    "KeySelf": {
        "allOf": [
            _ref("Key"),
            obj(
                {
                    "usage": obj(
                        {"day": _ref("SpendWindow"), "month": _ref("SpendWindow")},
                        ("day", "month"),
                    ),
                    "rate_limit": obj(
                        {
                            "requests_per_minute": COUNT,
                            "requests_this_minute": COUNT,
                            "tokens_per_minute": {"type": ["integer", "null"], "minimum": 0},
                            "tokens_this_minute": COUNT,
                            "max_in_flight": COUNT,
                            "in_flight": COUNT,
                        },
                        (
                            "requests_per_minute",
                            "requests_this_minute",
                            "tokens_per_minute",
                            "max_in_flight",
                            "in_flight",
                        ),
                    ),
                    "sub_key_count": COUNT,
                },
                ("usage", "rate_limit", "sub_key_count"),
            ),
        ]
    },
    "KeyWithToken": {
        "allOf": [
            _ref("Key"),
            obj({"token": {"type": "string", "pattern": "^svc_(live|test)_"}}, ("token",)),
        ],
    },
    "RevokedKey": {
        "allOf": [_ref("Key"), obj({"deleted": {"const": True}}, ("deleted",))],
    },
    "KeyList": obj(
        {
            "object": {"const": "list"},
            "data": {"type": "array", "items": _ref("Key")},
            "has_more": {"type": "boolean"},
        },
        ("object", "data", "has_more"),
    ),
    "Model": obj(
        {
            "id": STRING,
            "object": {"const": "model"},
            "created": {"type": "integer"},
            "owned_by": STRING,
            "kind": {"enum": ["chat", "embedding"]},
            "tools": {"type": "boolean"},
            "structured_output": {"type": "boolean"},
            "vision": {"type": "boolean"},
            "web_search": {"type": "boolean"},
            "zero_retention_available": {"type": "boolean"},
            "byok_available": {"type": "boolean"},
            "pricing": obj(
                {
                    "input_usd_per_mtok": USD_OR_NULL,
                    "output_usd_per_mtok": USD_OR_NULL,
                    "cache_read_usd_per_mtok": {
                        **USD_OR_NULL,
                        "description": "Cached input read; null: priced as input.",
                    },
                    "cache_write_usd_per_mtok": {
                        **USD_OR_NULL,
                        "description": "Input written to the cache; null: priced as input.",
                    },
                }
            ),
        },
        (
            "id",
            "object",
            "created",
            "owned_by",
            "tools",
            "structured_output",
            "vision",
            "zero_retention_available",
            "byok_available",
        ),
    ),
    "ModelList": obj(
        {"object": {"const": "list"}, "data": {"type": "array", "items": _ref("Model")}},
        ("object", "data"),
    ),
    "ChatCompletion": obj(
        {
            "id": STRING,
            "object": {"const": "chat.completion"},
            "created": {"type": "integer"},
            "model": STRING,
            "choices": {
                "type": "array",
                "minItems": 1,
                "items": obj(
                    {
                        "index": COUNT,
                        "message": obj(
                            {
                                "role": {"const": "assistant"},
                                "content": {"type": ["string", "null"]},
                                "tool_calls": {"type": "array", "items": {"type": "object"}},
                                "refusal": {"type": ["string", "null"]},
                            },
                            ("role", "content"),
                        ),
                        "finish_reason": {"type": ["string", "null"]},
                    },
                    ("index", "message", "finish_reason"),
                ),
            },
            "usage": obj(
                {"prompt_tokens": COUNT, "completion_tokens": COUNT, "total_tokens": COUNT},
                ("prompt_tokens", "completion_tokens", "total_tokens"),
            ),
            "svc": _ref("Svc"),
        },
        ("id", "object", "created", "model", "choices"),
    ),
    "Response": obj(
        {
            "id": STRING,
            "object": {"const": "response"},
            "created_at": {"type": "integer"},
            "status": STRING,
            "model": STRING,
            "output": {"type": "array", "items": obj({"type": STRING}, ("type",))},
            "usage": {
                "anyOf": [
                    {"type": "null"},
                    obj(
                        {"input_tokens": COUNT, "output_tokens": COUNT, "total_tokens": COUNT},
                        ("input_tokens", "output_tokens", "total_tokens"),
                    ),
                ]
            },
            "svc": _ref("Svc"),
        },
        ("id", "object", "status", "model", "output"),
    ),
    "EmbeddingList": obj(
        {
            "object": {"const": "list"},
            "data": {
                "type": "array",
                "items": obj(
                    {
                        "object": {"const": "embedding"},
                        "index": COUNT,
                        "embedding": {
                            "oneOf": [{"type": "array", "items": {"type": "number"}}, STRING],
                            "description": "Numbers, or base64 of float32 values",
                        },
                    },
                    ("object", "index", "embedding"),
                ),
            },
            "model": STRING,
            "usage": obj(
                {"prompt_tokens": COUNT, "total_tokens": COUNT},
                ("prompt_tokens", "total_tokens"),
            ),
            "svc": _ref("Svc"),
        },
        ("object", "data", "model", "usage"),
    ),
    "Usage": obj(
        {
            "object": {"const": "usage"},
            "start": {"type": "string", "format": "date"},
            "end": {"type": "string", "format": "date"},
            "group_by": {"type": ["string", "null"]},
            "totals": obj(USAGE_TOTALS, tuple(USAGE_TOTALS)),
            "data": {
                "type": "array",
                "items": obj(
                    {"group": {"type": ["string", "null"]}, **USAGE_TOTALS},
                    ("group", *USAGE_TOTALS),
                ),
            },
            # refused calls (no record each): counts by day, key and error code
            "refusals": {
                "type": "array",
                "items": obj(
                    {
                        "day": {"type": "string", "format": "date"},
                        "key_id": STRING,
                        "code": STRING,
                        "count": {"type": "integer", "minimum": 1},
                    },
                    ("day", "key_id", "code", "count"),
                ),
            },
        },
        ("object", "start", "end", "group_by", "totals", "data", "refusals"),
    ),
    "Credits": obj(
        {
            "object": {"const": "credits"},
            "org_id": STRING,
            "balance_usd": {"type": "number"},
            "reserved_usd": USD,
            "available_usd": {"type": "number"},
            "purchased_usd": USD,
            "used_usd": USD,
        },
        ("object", "balance_usd", "reserved_usd", "available_usd", "purchased_usd", "used_usd"),
    ),
    "RequestRecord": obj(
        {
            "id": {"type": "string", "pattern": id_pattern("req")},
            "object": {"const": "request"},
            "created": TIMESTAMP,
            "endpoint": STRING,
            "model": STRING,
            "provider": {"type": ["string", "null"]},
            "key_id": STRING,
            "mode": {"enum": ["live", "sandbox"]},
            "status": {"enum": ["succeeded", "failed", "cancelled"]},
            "http_status": {"type": "integer"},
            "stream": {"type": "boolean"},
            "tags": TAG_MAP,
            "usage": {
                "anyOf": [
                    {"type": "null"},
                    obj(
                        {
                            "input_tokens": {
                                **COUNT,
                                "description": "Every input token, cached ones included.",
                            },
                            "output_tokens": COUNT,
                            **CACHE_COUNTS,
                            "prompt_tokens": {**COUNT, "description": "input_tokens."},
                            "completion_tokens": {**COUNT, "description": "output_tokens."},
                            "total_tokens": COUNT,
                        },
                        ("input_tokens", "output_tokens", *CACHE_COUNTS),
                    ),
                ]
            },
            "cost": obj(
                {
                    "estimated_usd": USD,
                    "reserved_usd": USD,
                    "settled_usd": USD,
                    "billed_usd": USD,
                },
                ("estimated_usd", "reserved_usd", "settled_usd", "billed_usd"),
            ),
            "latency_ms": {"type": ["number", "null"]},
            "error": {"anyOf": [{"type": "null"}, obj({"code": STRING}, ("code",))]},
            "trace_id": {
                "type": ["string", "null"],
                "description": "The W3C trace id of the call (its traceparent).",
            },
            "attempts": {
                "type": "array",
                "description": "The call's provider attempts in order (deployments, retries"
                " before the first byte, fallback models); the last served the call when"
                " it succeeded.",
                "items": obj(
                    {
                        "model": STRING,
                        "provider": STRING,
                        "upstream_id": STRING,
                        "deployment": {"type": "integer", "minimum": 0},
                        "status": {
                            "type": ["integer", "null"],
                            "description": "The upstream's HTTP status (null: no answer).",
                        },
                        "code": {"type": ["string", "null"]},
                        "ttfb_ms": {"type": ["number", "null"]},
                    },
                    ("model", "provider", "upstream_id", "status", "code", "ttfb_ms"),
                ),
            },
            "guardrails": {
                "type": "array",
                "description": "The guardrails that denied, redacted or flagged in the call"
                " (never the text they matched).",
                "items": obj(
                    {
                        "name": STRING,
                        "direction": {"enum": ["input", "output"]},
                        "verdict": {"enum": ["deny", "redact", "flag"]},
                    },
                    ("name", "direction", "verdict"),
                ),
            },
        },
        ("id", "object", "created", "endpoint", "model", "status", "cost"),
    ),
}

#: one server-sent event of a streamed call (``stream: true``): its data a JSON object, or
#: ``[DONE]`` closing a chat completions stream; keep-alive comments are no events
SSE_EVENT = obj(
    {
        "event": STRING,
        "data": {"anyOf": [{"const": "[DONE]"}, {"type": "string", "pattern": "^\\{"}]},
    },
    ("data",),
)

# -- operations --------------------------------------------------------------------------

_ANY_KEY = ("invalid_api_key", "rate_limited", "admission_unavailable", "internal_error")
_SCOPED = (*_ANY_KEY, "scope_denied")
_BODY = ("invalid_request", "request_too_large", "request_body_timeout")
_RESOLVE = (
    "model_not_found",
    "model_not_allowed",
    "model_ambiguous",
    "model_unavailable",
    "model_not_priced",
    "model_not_zdr",
    "not_implemented",
    "entitlement_denied",
    "byok_unavailable",
    "provider_credential_missing",
    "pricing_unavailable",
)
_RESERVE = (
    "key_cap_exceeded",
    "insufficient_credits",
    "budget_exceeded",
    "spend_refused",
    "max_cost_per_request",
    "too_many_in_flight",
)
_PROVIDER = ("service_unavailable", "request_timeout", "byok_credential_rejected")
_MODEL_CALL = (
    *_SCOPED,
    *_BODY,
    *_RESOLVE,
    *_RESERVE,
    *_PROVIDER,
    "invalid_tags",
    "missing_tags",
    "unsupported_parameter",
    "max_tokens_exceeds_key_limit",
    "model_lacks_vision",
    "model_lacks_tools",
    "model_lacks_structured_output",
    "web_search_unavailable",
    "web_search_not_allowed",
    "connectors_require_user_session",
    "idempotency_conflict",
    "idempotency_key_reused",
    "duplicate_request",
    "content_blocked",
)
_KEYS = (*_SCOPED, *_BODY, "not_found", "child_exceeds_parent", "model_not_in_catalog")

_IDEMPOTENCY, _TAGS = IDEMPOTENCY_HEADER, TAGS_HEADER
#: Claude Code's ``?beta=true``: accepted, not read
BETA_QUERY = query("beta", {"type": "string"}, "Accepted and not read (Claude Code sends it).")
#: Anthropic's betas: forwarded as sent when an anthropic deployment serves the call
BETA_HEADER = {
    "name": "anthropic-beta",
    "in": "header",
    "required": False,
    "description": "Anthropic betas, comma-separated: forwarded as sent to an anthropic "
    "deployment (the call passed through); not read by a translation.",
    "schema": {"type": "string"},
}
#: paths whose errors are in Anthropic's dialect
ANTHROPIC_PATHS = ("/v1/messages", "/v1/messages/count_tokens")
#: codes answered only on POST /mcp: a JSON-RPC endpoint, described by the MCP
#: specification and README "Tools (MCP)", not by this document
MCP_ONLY_CODES = ("tool_not_allowed", "tool_not_found")


# (method, path, scope, summary, request schema, 2xx status, answer schema, codes, params)
OPERATIONS: tuple[tuple[Any, ...], ...] = (
    ("get", "/v1/models", "inference (none without a key)", "The model catalog", None, 200,
     "ModelList", ("invalid_api_key", "scope_denied", "rate_limited", "internal_error"), ()),
    ("get", "/v1/models/{model_id}", "inference (none without a key)",
     "One model of the catalog, by its id (which may hold a /) or an alias", None, 200,
     "Model", ("invalid_api_key", "scope_denied", "rate_limited", "model_not_found",
     "internal_error"), (path_param("model_id"),)),
    ("post", "/v1/chat/completions", "inference", "Chat completion, streamed or not",
     "ChatCompletionRequest", 200, "ChatCompletion", (*_MODEL_CALL, "validation_failed",
     "invalid_messages"), (_IDEMPOTENCY, _TAGS)),
    ("post", "/v1/responses", "inference", "A response (served through chat completions)",
     "ResponsesRequest", 200, "Response", (*_MODEL_CALL, "invalid_input"),
     (_IDEMPOTENCY, _TAGS)),
    ("post", "/v1/messages", "inference",
     "Anthropic's Messages API (passed through to an anthropic deployment, translated to "
     "chat completions for the other kinds; errors in Anthropic's dialect)",
     "MessagesRequest", 200, "Message", (*_MODEL_CALL, "invalid_messages"),
     (_IDEMPOTENCY, _TAGS, BETA_QUERY, BETA_HEADER)),
    ("post", "/v1/messages/count_tokens", "inference",
     "The gateway's conservative estimate of a Messages prompt's tokens (reserves nothing)",
     "CountTokensRequest", 200, "MessageTokensCount", (*_SCOPED, *_BODY, *_RESOLVE,
     "invalid_messages", "unsupported_parameter"), ()),
    ("post", "/v1/embeddings", "embeddings", "Embeddings of the one served embedding model",
     "EmbeddingsRequest", 200, "EmbeddingList", (*_SCOPED, *_BODY, *_RESOLVE, *_RESERVE,
     "content_blocked",
     *_PROVIDER, "invalid_tags", "missing_tags"), (_TAGS,)),
    ("get", "/v1/key", "none (any valid key)", "The calling key", None, 200, "KeySelf",
     _ANY_KEY, ()),
    ("get", "/v1/keys", "keys:manage", "The caller's sub-keys", None, 200, "KeyList",
     (*_SCOPED, "invalid_request", "not_found"),
     KEYS_QUERY),
    ("post", "/v1/keys", "keys:manage", "Create a sub-key (its token is shown once)",
     "SubKeyCreate", 201, "KeyWithToken", _KEYS, ()),
    ("patch", "/v1/keys/{key_id}", "keys:manage", "Disable or re-enable a sub-key",
     "SubKeyPatch", 200, "Key", (*_KEYS, "key_revoked"), (path_param("key_id", "key"),)),
    ("delete", "/v1/keys/{key_id}", "keys:manage", "Revoke a sub-key", None, 200, "RevokedKey",
     (*_SCOPED, "not_found"), (path_param("key_id", "key"),)),
    ("get", "/v1/usage", "usage:read", "Usage totals and groups", None, 200, "Usage",
     (*_SCOPED, "invalid_request"),
     USAGE_QUERY),
    ("get", "/v1/credits", "usage:read", "The organisation's credits", None, 200, "Credits",
     _SCOPED, ()),
    ("get", "/v1/requests/{request_id}", "usage:read", "One request record", None, 200,
     "RequestRecord", (*_SCOPED, "not_found"), (path_param("request_id", "req"),)),
)  # fmt: skip

_ANSWER_HEADERS = {
    "X-Request-Id": {"schema": {"type": "string"}, "description": "req_<hex>"},
    "X-RateLimit-Limit-Requests": {"schema": {"type": "string"}},
    "X-RateLimit-Remaining-Requests": {"schema": {"type": "string"}},
    "X-RateLimit-Reset-Requests": {"schema": {"type": "string"}, "description": "e.g. 23s"},
}


# codes a path answers with another status besides the catalog's (the spec's 400 row
# for a model other than the served embedding model; policy refusals stay 403)
ALSO_AT: dict[str, tuple[tuple[str, int], ...]] = {
    "/v1/embeddings": (("model_not_allowed", 400),),
}


# without a key GET /v1/models (and /v1/models/{id}) is limited per IP address: these
# two headers (on its 404 too), and a 429 whose body is plain text (the spec puts it
# outside the error shape)
_PUBLIC_HEADERS = {
    "X-RateLimit-Limit": {"schema": {"type": "string"}, "description": "Per IP, without a key"},
    "X-RateLimit-Remaining": {"schema": {"type": "string"}, "description": "Per IP, without a key"},
}


def _error_headers(codes: list[str]) -> dict[str, Any]:
    """Headers of an error answer; ``x-should-retry`` is a constant where the catalog
    gives every code of the status the same answer (409 and 503 hold both kinds)."""
    hints = sorted({retry_hint(CATALOG[code].retryable)[SHOULD_RETRY] for code in codes})
    hint = {"const": hints[0]} if len(hints) == 1 else {"type": "string", "enum": hints}
    return {
        "X-Request-Id": _ANSWER_HEADERS["X-Request-Id"],
        "Retry-After": {"schema": {"type": "string"}},
        SHOULD_RETRY: {"schema": hint, "description": "Whether a retry can succeed"},
    }


def _error_responses(path: str, codes: tuple[str, ...]) -> dict[str, Any]:
    by_status: dict[int, list[str]] = defaultdict(list)
    for code in dict.fromkeys((*codes, "method_not_allowed")):
        by_status[CATALOG[code].status].append(code)
    for code, status in ALSO_AT.get(path, ()):
        by_status[status].append(code)
    return {
        str(status): {
            "description": f"{error_type(status)}: {', '.join(sorted(names))}",
            "headers": _error_headers(names),
            "content": {
                JSON: {
                    "schema": _ref("AnthropicError" if path in ANTHROPIC_PATHS else "Error"),
                    "x-error-codes": sorted(names),
                }
            },
        }
        for status, names in sorted(by_status.items())
    }


#: the prompt of the example calls
EXAMPLE_PROMPT = "Say hello."


def _examples(chat_model: str | None, embedding_model: str | None) -> dict[tuple[str, str], Any]:
    """A working body per operation that takes one, by path and method: a generic client
    (Swagger UI's "try it out", a fuzzer given the document alone) reaches a served model.
    The output budgets are small, so that the worst case fits small caps."""
    examples: dict[tuple[str, str], Any] = {
        ("post", "/v1/keys"): {
            "name": "ci",
            "scopes": ["inference"],
            "caps": {"usd_day": 1, "rpm": 30},
            "default_tags": {"team": "ci"},
        },
        ("patch", "/v1/keys/{key_id}"): {"disabled": True},
    }
    if chat_model is not None:
        examples[("post", "/v1/chat/completions")] = {
            "model": chat_model,
            "messages": [{"role": "user", "content": EXAMPLE_PROMPT}],
            "max_tokens": 16,
        }
        examples[("post", "/v1/responses")] = {
            "model": chat_model,
            "input": EXAMPLE_PROMPT,
            "max_output_tokens": 16,
        }
        examples[("post", "/v1/messages")] = {
            "model": chat_model,
            "max_tokens": 16,
            "messages": [{"role": "user", "content": EXAMPLE_PROMPT}],
        }
        examples[("post", "/v1/messages/count_tokens")] = {
            "model": chat_model,
            "messages": [{"role": "user", "content": EXAMPLE_PROMPT}],
        }
        examples[("get", "/v1/models/{model_id}")] = {"model_id": chat_model}
    if embedding_model is not None:
        examples[("post", "/v1/embeddings")] = {"model": embedding_model, "input": EXAMPLE_PROMPT}
    return examples


def _operation(row: tuple[Any, ...], examples: dict[tuple[str, str], Any]) -> dict[str, Any]:
    method, path, scope, summary, body, status, answer, codes, params = row
    example = examples.get((method, path))
    content: dict[str, Any] = {JSON: {"schema": _ref(answer)}}
    if path in ("/v1/chat/completions", "/v1/responses", "/v1/messages"):
        content["text/event-stream"] = {"schema": SSE_EVENT}
    op: dict[str, Any] = {
        "operationId": method + "_" + re.sub(r"[^a-z0-9]+", "_", path[len("/v1/") :]).strip("_"),
        "summary": summary,
        "description": f"Scope: {scope}.",
        "parameters": [
            {**param, "example": example[param["name"]]}
            if body is None and example is not None and param["name"] in example
            else param
            for param in params
        ],
        "responses": {
            str(status): {"description": "OK", "headers": _ANSWER_HEADERS, "content": content},
            **_error_responses(path, codes),
        },
    }
    if body is not None:
        media: dict[str, Any] = {"schema": _ref(body)}
        if example is not None:
            media["example"] = example
        op["requestBody"] = {"required": True, "content": {JSON: media}}
    if path.startswith("/v1/models"):
        op["security"] = [{}, {"bearer": []}]
        for status in ("200", "404", "429"):
            answer = op["responses"].get(status)
            if answer is not None:
                answer["headers"] = {**answer["headers"], **_PUBLIC_HEADERS}
        op["responses"]["429"]["content"]["text/plain"] = {"schema": {"type": "string"}}
    return op


@cache
def document(chat_model: str | None = None, embedding_model: str | None = None) -> dict[str, Any]:
    """The document; a server gives the ids of a chat model and of the embedding model it
    serves, which the example bodies name (:mod:`gateway.edge.openapi_served`)."""
    examples = _examples(chat_model, embedding_model)
    paths: dict[str, dict[str, Any]] = defaultdict(dict)
    for row in OPERATIONS:
        paths[row[1]][row[0]] = _operation(row, examples)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "svc-gateway",
            "version": __version__,
            "description": "A key-authenticated gateway for language-model calls.",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": dict(paths),
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": SCHEMAS,
        },
    }
