"""What the parsers accept, as JSON Schema: the request half of the OpenAPI document.

Every bound here is read from the table or constant the parser itself checks (tags,
roles, scopes, caps, id shapes, limits), so a rule that changes in a parser changes in
the document. Exactness matters both ways: a request the schema allows must not be
refused as malformed (only for a reason of state: an unknown id, a model the catalog
lacks, a limit of the calling key), and a request the schema forbids must be refused.
``tests/edge/test_schemathesis.py`` checks both against a running server.

Conventions of the chat-completions and responses parsers that shape the schemas:

- a top-level ``null`` is a field not sent, on every field (:func:`nullable`);
- fields refused whatever their value accept only that ``null`` (:data:`REFUSED`);
- integers are read by orjson, exactly up to 64 bits: a larger one arrives as a float,
  which is "not an integer" (output budgets excepted: gateway/edge/http.py); a number
  written with a zero fraction (10.0) is the integer it names, up to 2**53.
"""

from __future__ import annotations

from typing import Any

from gateway.accounts.key_fields import (
    ALWAYS_LIMITED,
    MAX_COUNT,
    MAX_NAME,
    MAX_USD,
    MODEL_LIST,
    MODEL_LIST_ALIAS,
    USD_CAPS,
)
from gateway.accounts.key_record import CAP_FIELDS, DATA_MODES, ENVIRONMENTS, id_pattern
from gateway.accounts.subkey_rules import FIELDS as SUB_KEY_FIELDS
from gateway.accounts.subkey_rules import SUB_KEY_SCOPES
from gateway.accounts.tag_rules import CONTROL, MAX_TAGS, MAX_VALUE, TAG_KEY
from gateway.accounts.tool_rules import PATTERN_SYNTAX
from gateway.calls.parse.anthropic_messages import IMAGE_TYPES
from gateway.calls.parse.chat import CHAT_FIELDS, MAX_STOP, ROLES, STRUCTURED_FORMATS
from gateway.calls.parse.fields import SAMPLING, SESSION_FIELDS
from gateway.calls.parse.responses import INPUT_ROLES, RESPONSES_FIELDS, TEXT_PARTS
from gateway.edge.idempotency import MAX_LENGTH as IDEMPOTENCY_KEY_MAX
from gateway.edge.routes.subkeys import MAX_LIMIT
from gateway.edge.routes.usage import GROUPS

INT64_MIN, UINT64_MAX = -(2**63), 2**64 - 1
#: JSON Schema's integer admits 10.0, and so do the parsers (up to 2**53, where a number
#: with a fraction still names one integer exactly)
AS_WRITTEN = "An integer; 10.0 is read as 10 (with a fraction, up to 2**53)."
#: the largest integer orjson reads as an integer (a larger one is a float)
WHOLE = {"type": "integer", "maximum": UINT64_MAX, "description": AS_WRITTEN}
POSITIVE = {**WHOLE, "minimum": 1}
NON_NEGATIVE = {**WHOLE, "minimum": 0}
#: a field the server knows and refuses whatever its value; null is a field not sent
REFUSED = {"type": "null", "description": "Any value but null: 400 unsupported_parameter."}
#: connectors, hitl_approvals: they need a user session, so only an empty value passes
SESSION_ONLY: dict[str, object] = {
    "enum": [None, False, 0, "", [], {}],
    "description": "Needs a user session: a non-empty value is 400 "
    "connectors_require_user_session.",
}

# -- tags (gateway/accounts/tag_rules.py, gateway/calls/parse/tags.py) ---------------------------

TAG_KEY_PATTERN = f"^{TAG_KEY.pattern}$"
TAG_VALUE = {
    "type": "string",
    "maxLength": MAX_VALUE,
    "pattern": f"^[^{CONTROL.pattern[1:-1]}]*$",
}
TAG_MAP = {
    "type": "object",
    "maxProperties": MAX_TAGS,
    "propertyNames": {"pattern": TAG_KEY_PATTERN},
    "additionalProperties": TAG_VALUE,
}
# One header segment: key=value, the value percent-encoded. The document promises the
# printable-ASCII part of what the server reads (a percent escape counts as one
# character, so 200 of them decode to at most 200).
_RAW = r"[ -$&-+\--~]"  # printable ASCII but "," (the separator) and "%"
_ESCAPE = "%(?:[2-6][0-9A-Fa-f]|7[0-9A-Ea-e])"  # an escape of printable ASCII
_SEGMENT = rf"[ \t]*{TAG_KEY.pattern}[ \t]*=(?:{_RAW}|{_ESCAPE}){{0,{MAX_VALUE}}}"
TAGS_HEADER = {
    "name": "X-Svc-Tags",
    "in": "header",
    "description": f"Tags: k=v,k2=v2, values percent-encoded; at most {MAX_TAGS} per call "
    "with the body's metadata and svc_tags.",
    "schema": {
        "type": "string",
        "pattern": f"^(?:{_SEGMENT}(?:,{_SEGMENT}){{0,{MAX_TAGS - 1}}})?$",
    },
}
IDEMPOTENCY_HEADER = {
    "name": "Idempotency-Key",
    "in": "header",
    "description": "Idempotent retry: the same key and body replay the stored answer.",
    # printable, and HTTP drops a value's surrounding spaces
    "schema": {
        "type": "string",
        "pattern": f"^[!-~](?:[ -~]{{0,{IDEMPOTENCY_KEY_MAX - 2}}}[!-~])?$",
    },
}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` or null (a top-level null is a field not sent)."""
    if schema.get("type") == "null" or None in schema.get("enum", ()):
        return schema
    if isinstance(schema.get("type"), str) and not {"enum", "const"} & set(schema):
        return {**schema, "type": [schema["type"], "null"]}
    return {"anyOf": [schema, {"type": "null"}]}


def closed_body(
    table: frozenset[str],
    described: dict[str, Any],
    required: tuple[str, ...],
    nulls: bool = True,
) -> dict[str, Any]:
    """A closed body schema with exactly the fields of the parser's ``table``: those not
    ``described`` are :data:`REFUSED`; with ``nulls``, every optional field may be null."""
    unknown = set(described) - table
    if unknown:
        raise ValueError(f"fields the parser does not accept: {sorted(unknown)}")
    props = {name: REFUSED for name in sorted(table - set(described))}
    props.update(
        (name, nullable(schema) if nulls and name not in required else schema)
        for name, schema in described.items()
    )
    return {
        "type": "object",
        "properties": props,
        "required": list(required),
        "additionalProperties": False,
    }


def obj(
    props: dict[str, Any], required: tuple[str, ...] = (), closed: bool = False
) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        schema["required"] = list(required)
    if closed:
        schema["additionalProperties"] = False
    return schema


def _typed(kind: str, **props: Any) -> dict[str, Any]:
    """An object whose ``type`` member is ``kind`` and whose ``props`` are required."""
    return obj({"type": {"const": kind}, **props}, ("type", *props))


TEXT = {"type": "string"}
#: what str.strip() leaves something of: a character Python does not call a space (the
#: regex classes \s of JSON Schema's dialect and of Python differ, e.g. on U+001C)
NOT_BLANK = "[^{}]".format("".join(f"\\u{i:04x}" for i in range(0x3001) if chr(i).isspace()))
TOOL_PATTERN = PATTERN_SYNTAX.replace(r"\S", NOT_BLANK)
MODEL = {"type": "string", "minLength": 1}
SAMPLING_FIELDS = {
    name: {"type": "number", "minimum": 0, "maximum": high} for name, high in SAMPLING.items()
}
TOOL_CHOICE = {"enum": ["auto", "none"]}
COMMON = {
    "model": MODEL,
    **SAMPLING_FIELDS,
    "stream": {"type": "boolean"},
    "tool_choice": TOOL_CHOICE,
    "parallel_tool_calls": {"type": "boolean"},
    "user": TEXT,
    "service_tier": TEXT,
    "metadata": TAG_MAP,
    "svc_tags": TAG_MAP,
    "store": {"const": False},
    **dict.fromkeys(SESSION_FIELDS, SESSION_ONLY),
}

# -- POST /v1/chat/completions (gateway/calls/parse/chat.py) ----------------------------------

CHAT_CONTENT = {
    "oneOf": [
        TEXT,
        {"type": "array", "minItems": 1, "items": obj({"type": TEXT}, ("type",))},
    ]
}
MESSAGE = {
    **obj({"role": {"enum": list(ROLES)}}, ("role",)),
    # content, or an assistant turn of tool calls only, or of a refusal only
    "anyOf": [
        obj({"content": CHAT_CONTENT}, ("content",)),
        obj(
            {
                "role": {"const": "assistant"},
                "content": {"type": "null"},
                "tool_calls": {"type": "array", "minItems": 1},
            },
            ("tool_calls",),
        ),
        obj(
            {"role": {"const": "assistant"}, "content": {"type": "null"}, "refusal": TEXT},
            ("refusal",),
        ),
    ],
}
RESPONSE_FORMAT = {
    "oneOf": [
        _typed("text"),
        *(_typed(kind) for kind in STRUCTURED_FORMATS if kind != "json_schema"),
        _typed(
            "json_schema",
            json_schema=obj({"name": TEXT, "schema": {"type": ["object", "null"]}}, ("name",)),
        ),
    ]
}
CHAT_REQUEST = closed_body(
    CHAT_FIELDS,
    {
        **COMMON,
        "messages": {"type": "array", "minItems": 1, "items": MESSAGE},
        "max_tokens": POSITIVE,
        "max_completion_tokens": POSITIVE,
        "stop": {"oneOf": [TEXT, {"type": "array", "maxItems": MAX_STOP, "items": TEXT}]},
        "seed": {**WHOLE, "minimum": INT64_MIN},
        "stream_options": obj({"include_usage": {"description": "true: a final usage chunk"}}),
        "response_format": RESPONSE_FORMAT,
        "tools": {"type": "array", "items": {"type": "object"}},
        "web_search_options": {"type": "object"},
        "n": {"const": 1},
        "logprobs": {"const": False},
        "logit_bias": {"type": "object", "maxProperties": 0},
        "modalities": {"const": ["text"]},
    },
    ("model", "messages"),
)

# -- POST /v1/responses (gateway/calls/parse/responses.py) ------------------------------------

PART = {
    "anyOf": [
        *(_typed(kind, text=TEXT) for kind in TEXT_PARTS),
        _typed("refusal", refusal=TEXT),
        _typed("input_image", image_url=TEXT),
    ]
}
PARTS = {"type": "array", "minItems": 1, "items": PART}
INPUT_ITEM = {
    "anyOf": [
        obj(
            {
                "type": {"const": "message"},
                "role": {"enum": list(INPUT_ROLES)},
                "content": {"anyOf": [TEXT, PARTS]},
            },
            ("role", "content"),
        ),
        _typed("function_call", call_id=TEXT, name=TEXT, arguments=TEXT),
        _typed("function_call_output", call_id=TEXT, output={"anyOf": [TEXT, PARTS]}),
    ]
}
TEXT_FORMAT = {
    "oneOf": [
        _typed("text"),
        _typed("json_object"),
        _typed("json_schema", name=TEXT, schema={"type": "object"}),
    ]
}
RESPONSES_REQUEST = closed_body(
    RESPONSES_FIELDS,
    {
        **COMMON,
        "input": {"anyOf": [TEXT, {"type": "array", "minItems": 1, "items": INPUT_ITEM}]},
        "instructions": TEXT,
        "max_output_tokens": POSITIVE,
        "text": obj({"format": nullable(TEXT_FORMAT)}),
        "reasoning": {"type": "object"},
        "tools": {
            "type": "array",
            "items": {"anyOf": [_typed("function", name=TEXT), _typed("web_search")]},
        },
        "include": {
            "type": "array",
            "items": {"type": "string", "not": {"const": "message.output_text.logprobs"}},
        },
        "truncation": {"const": "disabled"},
        "background": {"const": False},
    },
    ("model", "input"),
)

# -- POST /v1/embeddings (gateway/calls/parse/embeddings.py): other fields are ignored ----------

TOKENS = {"type": "array", "minItems": 1, "items": NON_NEGATIVE}
EMBEDDINGS_REQUEST = obj(
    {
        "model": MODEL,
        "input": {
            "oneOf": [
                {"type": "string", "minLength": 1},
                {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
                TOKENS,
                {"type": "array", "minItems": 1, "items": TOKENS},
            ]
        },
        "encoding_format": {"enum": ["float", "base64", None]},
        "dimensions": nullable(POSITIVE),
        "metadata": nullable(TAG_MAP),
        "svc_tags": nullable(TAG_MAP),
    },
    ("model", "input"),
)

# -- /v1/keys (gateway/accounts/subkey_rules.py, gateway/accounts/key_fields.py) ----------------


def _cap(field: str) -> dict[str, Any]:
    if field in USD_CAPS:
        return {"type": ["number", "null"], "minimum": 0, "maximum": MAX_USD}
    count = {"type": "integer", "minimum": 1, "maximum": MAX_COUNT, "description": AS_WRITTEN}
    if field in ALWAYS_LIMITED:
        return count
    return {**count, "type": ["integer", "null"], "minimum": 0}


CAPS_REQUEST = obj({field: _cap(field) for field in CAP_FIELDS}, closed=True)
MODEL_LIST_SCHEMA = nullable({"type": "array", "minItems": 1, "items": MODEL})
SUB_KEY_REQUEST = closed_body(
    frozenset({*SUB_KEY_FIELDS, MODEL_LIST_ALIAS}),
    {
        # surrounding spaces are dropped; what is left is 1 to MAX_NAME characters
        "name": {"type": "string", "minLength": 1, "maxLength": MAX_NAME, "pattern": NOT_BLANK},
        "scopes": nullable({"type": "array", "items": {"enum": list(SUB_KEY_SCOPES)}}),
        "caps": nullable(CAPS_REQUEST),
        MODEL_LIST: MODEL_LIST_SCHEMA,
        MODEL_LIST_ALIAS: {
            **MODEL_LIST_SCHEMA,
            "deprecated": True,
            "description": f"The older name of {MODEL_LIST}; send one of the two.",
        },
        "allowed_tools": nullable(
            {
                "type": "array",
                # \S as Python reads it (JSON Schema's dialect calls U+001C no space)
                "items": {"type": "string", "pattern": f"^{TOOL_PATTERN}$"},
                "description": "MCP tool patterns (server__tool, server__*) within the parent's.",
            }
        ),
        "required_tags": nullable(TAG_MAP),
        "default_tags": nullable(TAG_MAP),
        "data_mode": {"enum": list(DATA_MODES)},
        "expires_at": {
            "type": ["string", "null"],
            "format": "date-time",
            "description": "Not later than the parent's expiry; a time already past makes a"
            " sub-key expired from its creation.",
        },
        "mode": {"enum": ["live", "sandbox"], "description": "The parent's, if sent."},
        "environment": {"enum": list(ENVIRONMENTS), "description": "The parent's, if sent."},
        "byok": {"type": "boolean", "description": "The parent's, if sent."},
        "guardrails": nullable(
            {
                "type": "array",
                "items": {"type": "string", "minLength": 1},
                "description": "Names of the server's [[guardrails]] added to the parent's.",
            }
        ),
    },
    ("name",),
    nulls=False,
)
SUB_KEY_REQUEST["not"] = {"required": [MODEL_LIST, MODEL_LIST_ALIAS]}
# -- the Messages endpoint (gateway/calls/parse/anthropic_messages.py) ---------------------
#: open bodies: fields not listed are accepted and dropped, named in svc.ignored_parameters
#: (Claude Code adds fields with its betas); blocks may carry members not listed
#: (cache_control, citations, ...)
ANTHROPIC_TEXT = _typed("text", text=TEXT)
ANTHROPIC_IMAGE = _typed(
    "image",
    source={
        "anyOf": [
            _typed("base64", media_type={"enum": list(IMAGE_TYPES)}, data=TEXT),
            _typed("url", url=TEXT),
        ]
    },
)
ANTHROPIC_TOOL_RESULT = obj(
    {
        "type": {"const": "tool_result"},
        "tool_use_id": TEXT,
        "content": {
            "anyOf": [TEXT, {"type": "array", "items": {"anyOf": [ANTHROPIC_TEXT,
                                                                  ANTHROPIC_IMAGE]}}]
        },
    },
    ("type", "tool_use_id"),
)  # fmt: skip
ANTHROPIC_TOOL_USE = _typed("tool_use", id=TEXT, name=TEXT, input={"type": "object"})
ANTHROPIC_THINKING = obj({"type": {"enum": ["thinking", "redacted_thinking"]}}, ("type",))


def _turn(role: str, *blocks: dict[str, Any]) -> dict[str, Any]:
    content = {"type": "array", "minItems": 1, "items": {"anyOf": list(blocks)}}
    return obj({"role": {"const": role}, "content": {"anyOf": [TEXT, content]}},
               ("role", "content"))  # fmt: skip


ANTHROPIC_PROMPT: dict[str, Any] = {
    "model": MODEL,
    "messages": {
        "type": "array",
        "minItems": 1,
        "items": {
            "anyOf": [
                _turn("user", ANTHROPIC_TEXT, ANTHROPIC_IMAGE, ANTHROPIC_TOOL_RESULT),
                _turn("assistant", ANTHROPIC_TEXT, ANTHROPIC_TOOL_USE, ANTHROPIC_THINKING),
                _turn("system", ANTHROPIC_TEXT),
            ]
        },
    },
    "system": {"anyOf": [TEXT, {"type": "array", "items": ANTHROPIC_TEXT}]},
    "max_tokens": POSITIVE,
    "stop_sequences": {"type": "array", "items": TEXT},
    "temperature": {"type": "number", "minimum": 0, "maximum": 1},
    "top_p": {"type": "number", "minimum": 0, "maximum": 1},
    "stream": {"type": "boolean"},
    "metadata": obj({"user_id": {"type": ["string", "null"]}}),
    "service_tier": TEXT,
    "svc_tags": TAG_MAP,
    "tools": {
        "type": "array",
        "items": {
            "anyOf": [
                obj(
                    {"type": {"const": "custom"}, "name": TEXT, "input_schema": {"type": "object"}},
                    ("name", "input_schema"),
                ),
                obj({"type": {"type": "string", "pattern": "^web_search_"}}, ("type",)),
            ]
        },
    },
    "tool_choice": obj(
        {
            "type": {"enum": ["auto", "none"]},
            "disable_parallel_tool_use": {"type": ["boolean", "null"]},
        },
        ("type",),
    ),
    "container": REFUSED,
    "mcp_servers": REFUSED,
}


def _anthropic_body(required: tuple[str, ...], unread: tuple[str, ...] = ()) -> dict[str, Any]:
    """A Messages body: a top-level null is a field not sent; ``unread`` fields are not
    described (any value is accepted and not read)."""
    props = {
        name: schema if name in required or schema is REFUSED else nullable(schema)
        for name, schema in ANTHROPIC_PROMPT.items()
        if name not in unread
    }
    return obj(props, required)


MESSAGES_REQUEST = _anthropic_body(("model", "max_tokens", "messages"))
#: count_tokens reads no tags: it makes no call to tag
COUNT_TOKENS_REQUEST = _anthropic_body(("model", "messages"), unread=("svc_tags",))

SUB_KEY_PATCH = obj({"disabled": {"type": "boolean"}}, ("disabled",), closed=True)

# -- path and query parameters -----------------------------------------------------------


def path_param(name: str, kind: str | None = None) -> dict[str, Any]:
    """A path parameter; ``kind`` names the id form (key, req) when there is one."""
    schema: dict[str, Any] = {"type": "string", "minLength": 1}
    if kind is not None:
        schema["pattern"] = id_pattern(kind)
    return {"name": name, "in": "path", "required": True, "schema": schema}


def query(name: str, schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    param = {"name": name, "in": "query", "required": False, "schema": schema}
    if description:
        param["description"] = description
    return param


KEYS_QUERY = (
    query("limit", {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}),
    query(
        "after",
        {"type": "string", "pattern": id_pattern("key")},
        "The id of one of the caller's sub-keys: the last of the previous page. Another id"
        " is 404 not_found.",
    ),
)
USAGE_QUERY = (
    query(
        "start",
        {"type": "string", "format": "date"},
        "Default: the first day of the current month, or of end's month if earlier.",
    ),
    query(
        "end",
        {"type": "string", "format": "date"},
        "Default: the last day of the current month, or of start's month if later. An end"
        " before start is a window of no day (zeros).",
    ),
    query(
        "group_by",
        {"type": "string", "pattern": f"^(?:{'|'.join(GROUPS)}|tag:{TAG_KEY.pattern})$"},
    ),
)
