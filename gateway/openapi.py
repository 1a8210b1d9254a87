"""The OpenAPI 3.1 document of every /v1 endpoint, built from the routes' own tables.

Error answers come from the error catalog (:mod:`gateway.errors`): each operation lists
the codes it can answer, grouped by the status the catalog gives them, so a code that
moves to another status moves here too. ``tests/test_openapi.py`` checks that every /v1
route of the app is described and that the document is valid OpenAPI 3.1.
"""

from __future__ import annotations

import re
from collections import defaultdict
from functools import cache
from typing import Any

from gateway import __version__
from gateway.calls.chat import CHAT_FIELDS
from gateway.calls.responses import RESPONSES_FIELDS
from gateway.errors import CATALOG, SHOULD_RETRY, error_type, retry_hint
from gateway.subkeys import FIELDS as SUB_KEY_FIELDS

JSON = "application/json"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(props: dict[str, Any], required: tuple[str, ...] = (), closed: bool = False) -> dict:
    schema: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        schema["required"] = list(required)
    if closed:
        schema["additionalProperties"] = False
    return schema


def _request(
    table: frozenset[str], described: dict[str, Any], required: tuple[str, ...]
) -> dict[str, Any]:
    """A closed request schema with exactly the fields of the parser's ``table``: those
    not ``described`` are refused whatever their value (400 unsupported_parameter)."""
    unknown = set(described) - table
    if unknown:
        raise ValueError(f"fields the parser does not accept: {sorted(unknown)}")
    props = dict(described)
    props.update((name, REFUSED) for name in sorted(table - set(described)))
    return _obj(props, required, closed=True)


#: a field the server knows and refuses whatever its value, null included
REFUSED = {"not": {}, "description": "Refused whatever its value: 400 unsupported_parameter."}
#: connectors, hitl_approvals: they need a user session, so only an empty value passes
SESSION_ONLY = {
    "anyOf": [
        {"type": "null"},
        {"type": "array", "maxItems": 0},
        {"type": "object", "maxProperties": 0},
        {"const": ""},
    ],
    "description": "Needs a user session: a non-empty value is 400 "
    "connectors_require_user_session.",
}
FALSE_ONLY = {"enum": [False, None]}
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string", "maxLength": 200}}
POSITIVE = {"type": "integer", "minimum": 1}
USD = {"type": "number", "minimum": 0}

SCHEMAS: dict[str, Any] = {
    "Error": _obj(
        {
            "error": _obj(
                {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "code": {"type": "string", "enum": sorted(CATALOG)},
                    "param": {"type": ["string", "null"]},
                },
                ("message", "type", "code", "param"),
            ),
            "svc": _ref("Svc"),
        },
        ("error",),
    ),
    "Svc": _obj(
        {
            "request_id": {"type": "string", "pattern": "^req_[0-9a-f]+$"},
            "policy": _obj(
                {
                    "decisions": {
                        "type": "array",
                        "items": _obj(
                            {"rule": {"type": "string"}, "verdict": {"const": "deny"}},
                            ("rule", "verdict"),
                        ),
                    }
                }
            ),
            "ignored_parameters": {"type": "array", "items": {"type": "string"}},
        }
    ),
    "Message": _obj(
        {
            "role": {"type": "string", "enum": ["system", "user", "assistant", "tool"]},
            "content": {"type": ["string", "array", "null"]},
            "name": {"type": "string"},
            "tool_calls": {"type": "array"},
            "tool_call_id": {"type": "string"},
        },
        ("role", "content"),
    ),
    "ChatCompletionRequest": _request(
        CHAT_FIELDS,
        {
            "model": {"type": "string"},
            "messages": {"type": "array", "minItems": 1, "items": _ref("Message")},
            "temperature": {"type": "number", "minimum": 0, "maximum": 2},
            "top_p": {"type": "number", "minimum": 0, "maximum": 1},
            "max_tokens": POSITIVE,
            "max_completion_tokens": POSITIVE,
            "stop": {
                "oneOf": [
                    {"type": "string"},
                    {"type": "array", "maxItems": 4, "items": {"type": "string"}},
                ]
            },
            "seed": {"type": "integer"},
            "stream": {"type": "boolean"},
            "stream_options": _obj({"include_usage": {"type": "boolean"}}),
            "response_format": {"type": "object"},
            "tools": {"type": "array", "items": {"type": "object"}},
            "tool_choice": {"type": "string", "enum": ["auto", "none"]},
            "web_search_options": {"type": "object"},
            "metadata": STRING_MAP,
            "svc_tags": STRING_MAP,
            "user": {"type": "string"},
            "parallel_tool_calls": {"type": "boolean"},
            "service_tier": {"type": "string"},
            "n": {"type": "integer", "minimum": 1, "maximum": 1},
            "logprobs": FALSE_ONLY,
            "logit_bias": {"type": ["object", "null"], "maxProperties": 0},
            "modalities": {"anyOf": [{"type": "null"}, {"const": ["text"]}]},
            "store": FALSE_ONLY,
            "connectors": SESSION_ONLY,
            "hitl_approvals": SESSION_ONLY,
        },
        ("model", "messages"),
    ),
    "ResponsesRequest": _request(
        RESPONSES_FIELDS,
        {
            "model": {"type": "string"},
            "input": {"type": ["string", "array"]},
            "instructions": {"type": "string"},
            "max_output_tokens": POSITIVE,
            "temperature": {"type": "number", "minimum": 0, "maximum": 2},
            "top_p": {"type": "number", "minimum": 0, "maximum": 1},
            "text": _obj(
                {"format": {"type": "object"}, "verbosity": {"type": "string"}},
            ),
            "reasoning": {"type": "object"},
            "tools": {
                "type": "array",
                "items": _obj(
                    {"type": {"type": "string", "enum": ["function", "web_search"]}}, ("type",)
                ),
            },
            "tool_choice": {"type": "string", "enum": ["auto", "none"]},
            "stream": {"type": "boolean"},
            "metadata": STRING_MAP,
            "svc_tags": STRING_MAP,
            "user": {"type": "string"},
            "parallel_tool_calls": {"type": "boolean"},
            "service_tier": {"type": "string"},
            "include": {
                "type": "array",
                "items": {"type": "string", "not": {"const": "message.output_text.logprobs"}},
            },
            "truncation": {"enum": ["disabled", None]},
            "store": FALSE_ONLY,
            "background": FALSE_ONLY,
            "connectors": SESSION_ONLY,
            "hitl_approvals": SESSION_ONLY,
        },
        ("model", "input"),
    ),
    "EmbeddingsRequest": _obj(
        {
            "model": {"type": "string"},
            "input": {
                "oneOf": [
                    {"type": "string"},
                    {"type": "array", "items": {"type": "string"}},
                    {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
                ]
            },
            "encoding_format": {"type": "string", "enum": ["float", "base64"]},
            "dimensions": POSITIVE,
        },
        ("model", "input"),
    ),
    "Caps": _obj(
        {
            "usd_day": {"type": ["number", "null"], "minimum": 0},
            "usd_month": {"type": ["number", "null"], "minimum": 0},
            "rpm": POSITIVE,
            "tpm": {"type": ["integer", "null"], "minimum": 1},
            "max_in_flight": POSITIVE,
            "max_output_tokens": POSITIVE,
        }
    ),
    "SubKeyCreate": _request(
        SUB_KEY_FIELDS,
        {
            "name": {"type": "string", "minLength": 1},
            "scopes": {
                "type": "array",
                "items": {"type": "string", "enum": ["inference", "embeddings", "usage:read"]},
            },
            "caps": _ref("Caps"),
            "allowed_models": {"type": "array", "minItems": 1, "items": {"type": "string"}},
            "required_tags": STRING_MAP,
            "default_tags": STRING_MAP,
            "data_mode": {"type": "string", "enum": ["standard", "zero_retention", "confidential"]},
            "expires_at": {"type": ["string", "null"], "format": "date-time"},
            "mode": {"type": "string"},
            "environment": {"type": "string"},
            "byok": {"type": "boolean"},
        },
        ("name",),
    ),
    "SubKeyPatch": _obj({"disabled": {"type": "boolean"}}, ("disabled",), closed=True),
    "Key": _obj(
        {
            "id": {"type": "string"},
            "name": {"type": "string"},
            "prefix": {"type": "string"},
            "status": {"type": "string", "enum": ["active", "disabled", "revoked", "expired"]},
            "mode": {"type": "string", "enum": ["live", "sandbox"]},
            "environment": {"type": "string"},
            "data_mode": {"type": "string"},
            "scopes": {"type": "array", "items": {"type": "string"}},
            "allowed_model_keys": {"type": ["array", "null"], "items": {"type": "string"}},
            "caps": _ref("Caps"),
            "required_tags": STRING_MAP,
            "default_tags": STRING_MAP,
            "expires_at": {"type": ["string", "null"]},
            "last_used_at": {"type": ["string", "null"]},
            "parent_id": {"type": ["string", "null"]},
        },
        ("id", "name", "prefix", "status", "mode", "scopes", "caps"),
    ),
    "SpendWindow": _obj(
        {
            "spent_usd": USD,
            "reserved_usd": USD,
            "limit_usd": {"type": ["number", "null"]},
            "remaining_usd": {"type": ["number", "null"]},
            "resets_at": {"type": "string"},
        },
        ("spent_usd", "reserved_usd", "limit_usd", "remaining_usd", "resets_at"),
    ),
    "KeySelf": {
        "allOf": [
            _ref("Key"),
            _obj(
                {
                    "usage": _obj(
                        {"day": _ref("SpendWindow"), "month": _ref("SpendWindow")},
                        ("day", "month"),
                    ),
                    "rate_limit": _obj(
                        {
                            "requests_per_minute": {"type": "integer"},
                            "requests_this_minute": {"type": "integer"},
                            "tokens_per_minute": {"type": ["integer", "null"]},
                            "max_in_flight": {"type": "integer"},
                            "in_flight": {"type": "integer"},
                        }
                    ),
                    "sub_key_count": {"type": "integer"},
                },
                ("usage", "rate_limit", "sub_key_count"),
            ),
        ]
    },
    "KeyWithToken": {
        "allOf": [_ref("Key"), _obj({"token": {"type": "string"}}, ("token",))],
    },
    "KeyList": _obj(
        {
            "object": {"const": "list"},
            "data": {"type": "array", "items": _ref("Key")},
            "has_more": {"type": "boolean"},
        },
        ("object", "data", "has_more"),
    ),
    "Model": _obj(
        {
            "id": {"type": "string"},
            "object": {"const": "model"},
            "created": {"type": "integer"},
            "owned_by": {"type": "string"},
            "kind": {"type": "string", "enum": ["chat", "embedding"]},
            "tools": {"type": "boolean"},
            "structured_output": {"type": "boolean"},
            "vision": {"type": "boolean"},
            "web_search": {"type": "boolean"},
            "zero_retention_available": {"type": "boolean"},
            "byok_available": {"type": "boolean"},
            "pricing": {"type": "object"},
        },
        ("id", "object", "created", "owned_by"),
    ),
    "ModelList": _obj(
        {"object": {"const": "list"}, "data": {"type": "array", "items": _ref("Model")}},
        ("object", "data"),
    ),
    "ChatCompletion": _obj(
        {
            "id": {"type": "string"},
            "object": {"const": "chat.completion"},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "choices": {"type": "array", "items": {"type": "object"}},
            "usage": {"type": "object"},
            "svc": _ref("Svc"),
        },
        ("id", "object", "created", "model", "choices"),
    ),
    "Response": _obj(
        {
            "id": {"type": "string"},
            "object": {"const": "response"},
            "status": {"type": "string"},
            "model": {"type": "string"},
            "output": {"type": "array"},
            "usage": {"type": ["object", "null"]},
            "svc": _ref("Svc"),
        },
        ("id", "object", "model", "output"),
    ),
    "EmbeddingList": _obj(
        {
            "object": {"const": "list"},
            "data": {"type": "array", "items": {"type": "object"}},
            "model": {"type": "string"},
            "usage": {"type": "object"},
        },
        ("object", "data", "model"),
    ),
    "Usage": _obj(
        {
            "object": {"type": "string"},
            "start": {"type": "string", "format": "date"},
            "end": {"type": "string", "format": "date"},
            "group_by": {"type": ["string", "null"]},
            "totals": {"type": "object"},
            "data": {"type": "array", "items": {"type": "object"}},
        },
        ("start", "end", "totals", "data"),
    ),
    "Credits": _obj(
        {
            "balance_usd": {"type": "number"},
            "reserved_usd": USD,
            "available_usd": {"type": "number"},
            "purchased_usd": USD,
            "used_usd": USD,
        },
        ("balance_usd", "reserved_usd", "available_usd", "purchased_usd", "used_usd"),
    ),
    "RequestRecord": _obj(
        {
            "id": {"type": "string"},
            "object": {"const": "request"},
            "created": {"type": "string"},
            "endpoint": {"type": "string"},
            "model": {"type": "string"},
            "provider": {"type": "string"},
            "key_id": {"type": "string"},
            "mode": {"type": "string", "enum": ["live", "sandbox"]},
            "status": {"type": "string", "enum": ["succeeded", "failed", "cancelled"]},
            "http_status": {"type": "integer"},
            "stream": {"type": "boolean"},
            "tags": STRING_MAP,
            "usage": {"type": ["object", "null"]},
            "cost": _obj(
                {
                    "estimated_usd": USD,
                    "reserved_usd": USD,
                    "settled_usd": USD,
                    "billed_usd": USD,
                },
                ("settled_usd",),
            ),
            "latency_ms": {"type": "number"},
            "error": {"type": ["object", "null"]},
            "trace_id": {
                "type": ["string", "null"],
                "description": "The W3C trace id of the call (its traceparent).",
            },
        },
        ("id", "cost"),
    ),
}

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
)
_KEYS = (*_SCOPED, *_BODY, "not_found", "child_exceeds_parent", "model_not_in_catalog")

_IDEMPOTENCY = {
    "name": "Idempotency-Key",
    "in": "header",
    "description": "Idempotent retry: the same key and body replay the stored answer.",
    "schema": {"type": "string", "minLength": 1, "maxLength": 255},
}
_TAGS = {
    "name": "X-Svc-Tags",
    "in": "header",
    "description": "Tags: k=v,k2=v2 (values percent-encoded).",
    "schema": {"type": "string"},
}


def _path_param(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def _query(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema}


# (method, path, scope, summary, request schema, 2xx status, answer schema, codes, params)
OPERATIONS: tuple[tuple[Any, ...], ...] = (
    ("get", "/v1/models", "inference (none without a key)", "The model catalog", None, 200,
     "ModelList", ("invalid_api_key", "scope_denied", "rate_limited", "internal_error"), ()),
    ("get", "/v1/models/{model_id}", "inference (none without a key)",
     "One model of the catalog, by its id (which may hold a /) or an alias", None, 200,
     "Model", ("invalid_api_key", "scope_denied", "rate_limited", "model_not_found",
     "internal_error"), (_path_param("model_id"),)),
    ("post", "/v1/chat/completions", "inference", "Chat completion, streamed or not",
     "ChatCompletionRequest", 200, "ChatCompletion", (*_MODEL_CALL, "validation_failed",
     "invalid_messages"), (_IDEMPOTENCY, _TAGS)),
    ("post", "/v1/responses", "inference", "A response (served through chat completions)",
     "ResponsesRequest", 200, "Response", (*_MODEL_CALL, "invalid_input"),
     (_IDEMPOTENCY, _TAGS)),
    ("post", "/v1/embeddings", "embeddings", "Embeddings of the one served embedding model",
     "EmbeddingsRequest", 200, "EmbeddingList", (*_SCOPED, *_BODY, *_RESOLVE, *_RESERVE,
     *_PROVIDER, "invalid_tags", "missing_tags"), (_TAGS,)),
    ("get", "/v1/key", "none (any valid key)", "The calling key", None, 200, "KeySelf",
     _ANY_KEY, ()),
    ("get", "/v1/keys", "keys:manage", "The caller's sub-keys", None, 200, "KeyList",
     (*_SCOPED, "invalid_request"),
     (_query("limit", {"type": "integer", "minimum": 1, "maximum": 100}),
      _query("after", {"type": "string"}))),
    ("post", "/v1/keys", "keys:manage", "Create a sub-key (its token is shown once)",
     "SubKeyCreate", 201, "KeyWithToken", _KEYS, ()),
    ("patch", "/v1/keys/{key_id}", "keys:manage", "Disable or re-enable a sub-key",
     "SubKeyPatch", 200, "Key", (*_KEYS, "key_revoked"), (_path_param("key_id"),)),
    ("delete", "/v1/keys/{key_id}", "keys:manage", "Revoke a sub-key", None, 200, "Key",
     (*_SCOPED, "not_found"), (_path_param("key_id"),)),
    ("get", "/v1/usage", "usage:read", "Usage totals and groups", None, 200, "Usage",
     (*_SCOPED, "invalid_request"),
     (_query("start", {"type": "string", "format": "date"}),
      _query("end", {"type": "string", "format": "date"}),
      _query("group_by", {"type": "string", "pattern": "^(day|model|key|tag:.+)$"}))),
    ("get", "/v1/credits", "usage:read", "The organisation's credits", None, 200, "Credits",
     _SCOPED, ()),
    ("get", "/v1/requests/{request_id}", "usage:read", "One request record", None, 200,
     "RequestRecord", (*_SCOPED, "not_found"), (_path_param("request_id"),)),
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
                    "schema": _ref("Error"),
                    "x-error-codes": sorted(names),
                }
            },
        }
        for status, names in sorted(by_status.items())
    }


def _operation(row: tuple[Any, ...]) -> dict[str, Any]:
    method, path, scope, summary, body, status, answer, codes, params = row
    content: dict[str, Any] = {JSON: {"schema": _ref(answer)}}
    if path in ("/v1/chat/completions", "/v1/responses"):
        content["text/event-stream"] = {"schema": {"type": "string"}}
    op: dict[str, Any] = {
        "operationId": method + "_" + re.sub(r"[^a-z0-9]+", "_", path[len("/v1/") :]).strip("_"),
        "summary": summary,
        "description": f"Scope: {scope}.",
        "parameters": list(params),
        "responses": {
            str(status): {"description": "OK", "headers": _ANSWER_HEADERS, "content": content},
            **_error_responses(path, codes),
        },
    }
    if body is not None:
        op["requestBody"] = {"required": True, "content": {JSON: {"schema": _ref(body)}}}
    if path.startswith("/v1/models"):
        op["security"] = [{}, {"bearer": []}]
        for status in ("200", "404", "429"):
            answer = op["responses"].get(status)
            if answer is not None:
                answer["headers"] = {**answer["headers"], **_PUBLIC_HEADERS}
        op["responses"]["429"]["content"]["text/plain"] = {"schema": {"type": "string"}}
    return op


@cache
def document() -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = defaultdict(dict)
    for row in OPERATIONS:
        paths[row[1]][row[0]] = _operation(row)
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
