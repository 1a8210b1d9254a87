"""The spec's request tables, through HTTP: one case per row, status, code, type and param.

Rows mirror the spec: the POST /v1/chat/completions and /v1/responses request tables,
the /v1/embeddings fields, the unsupported-parameter lists and the rows of the 400 table
(and the 403/404/501 refusals) these three endpoints can produce. A row may name the
settings of a key to create first (required tags, allowed models, data mode...).

Every answer carries X-Request-Id; an error is in the spec's shape with the type derived
from the status; a success carries ``svc`` with the request id and ignored_parameters.
Answers of admitted requests carry the rate-limit headers, except invalid_tags and
missing_tags (admission itself refused).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest
import trio

from tests.conftest import Gateway

CHAT = "/v1/chat/completions"
RESP = "/v1/responses"
EMB = "/v1/embeddings"
MODEL = "gpt-4o-mini"  # every capability
BASIC = "mock-basic"  # no capability, no zero retention
EMBED = "text-embedding-3-small"
USER = [{"role": "user", "content": "hi"}]
IMAGE_MESSAGES = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        ],
    }
]
IMAGE_INPUT = [
    {
        "role": "user",
        "content": [
            {"type": "input_text", "text": "what is this?"},
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
        ],
    }
]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
RESP_TOOL = {"type": "function", "name": "f", "parameters": {"type": "object"}}
SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
TEXT_SCHEMA = {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}
RATE_HEADER = "X-RateLimit-Limit-Requests"
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    501: "api_error",
}


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": USER, **fields}


def resp(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "input": "hi", **fields}


def emb(**fields: Any) -> dict[str, Any]:
    return {"model": EMBED, "input": "hi", **fields}


def tags(count: int, prefix: str = "t") -> dict[str, str]:
    return {f"{prefix}{i}": "v" for i in range(count)}


def header_tags(count: int) -> str:
    return ",".join(f"h{i}=v" for i in range(count))


@dataclass(frozen=True)
class Row:
    """One row of a spec table: a request and the answer the spec gives it.

    ``code`` None is a success (200); ``ignored`` then is the expected
    svc.ignored_parameters. ``key`` holds the settings of a key created for the row.
    """

    case: str
    path: str
    body: Any
    status: int = 400
    code: str | None = None
    param: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    key: dict[str, Any] | None = None
    ignored: tuple[str, ...] = ()
    message_has: tuple[str, ...] = ()


def ok(case: str, path: str, body: Any, **kwargs: Any) -> Row:
    return Row(case, path, body, status=200, **kwargs)


def bad(case: str, path: str, body: Any, code: str, param: str | None, **kwargs: Any) -> Row:
    return Row(case, path, body, code=code, param=param, **kwargs)


CHAT_ROWS = [
    # model
    bad("chat: model missing", CHAT, {"messages": USER}, "validation_failed", "model"),
    bad("chat: model not a string", CHAT, chat(model=4), "invalid_request", "model"),
    bad("chat: embedding model", CHAT, chat(model=EMBED), "invalid_request", "model"),
    # messages
    bad("chat: messages missing", CHAT, {"model": MODEL}, "invalid_messages", "messages"),
    bad("chat: messages empty", CHAT, chat(messages=[]), "invalid_messages", "messages"),
    bad(
        "chat: message without content",
        CHAT,
        chat(messages=[{"role": "user"}]),
        "invalid_messages",
        "messages",
    ),
    bad(
        "chat: role developer refused",
        CHAT,
        chat(messages=[{"role": "developer", "content": "x"}]),
        "invalid_messages",
        "messages",
    ),
    bad(
        "chat: role unknown",
        CHAT,
        chat(messages=[{"role": "bot", "content": "x"}]),
        "invalid_messages",
        "messages",
    ),
    ok(
        "chat: roles system user assistant tool",
        CHAT,
        chat(
            messages=[
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "again"},
            ]
        ),
    ),
    # sampling, budgets, stop, seed, stream
    bad("chat: temperature above 2", CHAT, chat(temperature=2.1), "invalid_request", "temperature"),
    bad("chat: temperature below 0", CHAT, chat(temperature=-1), "invalid_request", "temperature"),
    ok("chat: temperature 2", CHAT, chat(temperature=2)),
    bad("chat: top_p above 1", CHAT, chat(top_p=1.5), "invalid_request", "top_p"),
    ok("chat: top_p 0", CHAT, chat(top_p=0)),
    bad("chat: max_tokens 0", CHAT, chat(max_tokens=0), "invalid_request", "max_tokens"),
    bad("chat: max_tokens a float", CHAT, chat(max_tokens=2.5), "invalid_request", "max_tokens"),
    bad(
        "chat: max_completion_tokens negative",
        CHAT,
        chat(max_completion_tokens=-1),
        "invalid_request",
        "max_completion_tokens",
    ),
    ok("chat: max_completion_tokens", CHAT, chat(max_completion_tokens=5)),
    bad(
        "chat: five stop sequences",
        CHAT,
        chat(stop=["a", "b", "c", "d", "e"]),
        "invalid_request",
        "stop",
    ),
    ok("chat: four stop sequences", CHAT, chat(stop=["a", "b", "c", "d"])),
    bad("chat: seed not an integer", CHAT, chat(seed="7"), "invalid_request", "seed"),
    ok("chat: seed", CHAT, chat(seed=7)),
    bad("chat: stream not a boolean", CHAT, chat(stream="yes"), "invalid_request", "stream"),
    # output budget against the key's limit
    bad(
        "chat: max_tokens above the key limit",
        CHAT,
        chat(max_tokens=4097),
        "max_tokens_exceeds_key_limit",
        "max_tokens",
    ),
    bad(
        "chat: max_completion_tokens above the key limit, param max_tokens",
        CHAT,
        chat(max_completion_tokens=4097),
        "max_tokens_exceeds_key_limit",
        "max_tokens",
    ),
    bad(
        "chat: budget above a key's own limit",
        CHAT,
        chat(max_completion_tokens=101),
        "max_tokens_exceeds_key_limit",
        "max_tokens",
        key={"caps": {"max_output_tokens": 100}},
    ),
    bad(
        "chat: max_completion_tokens beyond 64 bits is an integer over the limit",
        CHAT,
        chat(max_completion_tokens=10**20),
        "max_tokens_exceeds_key_limit",
        "max_tokens",
    ),
    bad("chat: seed beyond 64 bits", CHAT, chat(seed=10**20), "invalid_request", "seed"),
    ok("chat: seed at 64 bits", CHAT, chat(seed=-(2**63))),
    ok("chat: budget at the key limit", CHAT, chat(max_tokens=4096)),
    # capabilities of the model (mock-basic has none)
    bad(
        "chat: response_format on a model without structured output",
        CHAT,
        chat(model=BASIC, response_format=SCHEMA),
        "model_lacks_structured_output",
        "response_format",
    ),
    bad(
        "chat: json_object on a model without structured output",
        CHAT,
        chat(model=BASIC, response_format={"type": "json_object"}),
        "model_lacks_structured_output",
        "response_format",
    ),
    ok(
        "chat: response_format text on mock-basic",
        CHAT,
        chat(model=BASIC, response_format={"type": "text"}),
    ),
    ok("chat: response_format json_schema", CHAT, chat(response_format=SCHEMA)),
    bad(
        "chat: tools on a model without tools",
        CHAT,
        chat(model=BASIC, tools=[TOOL]),
        "model_lacks_tools",
        "tools",
    ),
    ok("chat: tools", CHAT, chat(tools=[TOOL])),
    bad(
        "chat: image on a model without vision",
        CHAT,
        chat(model=BASIC, messages=IMAGE_MESSAGES),
        "model_lacks_vision",
        "messages",
    ),
    ok("chat: image on a vision model", CHAT, chat(messages=IMAGE_MESSAGES)),
    bad(
        "chat: web search on a model without it",
        CHAT,
        chat(model=BASIC, web_search_options={}),
        "web_search_unavailable",
        "web_search_options",
    ),
    ok(
        "chat: web search forwarded, ignored by the mock",
        CHAT,
        chat(web_search_options={}),
        ignored=("web_search_options",),
    ),
    # tool_choice
    ok("chat: tool_choice auto", CHAT, chat(tools=[TOOL], tool_choice="auto")),
    ok("chat: tool_choice none", CHAT, chat(tools=[TOOL], tool_choice="none")),
    # accepted, no effect
    ok("chat: user", CHAT, chat(user="u-1")),
    ok("chat: stream_options", CHAT, chat(stream_options={"include_usage": True})),
    ok("chat: parallel_tool_calls", CHAT, chat(tools=[TOOL], parallel_tool_calls=False)),
    ok("chat: service_tier", CHAT, chat(service_tier="default")),
    ok("chat: tags in metadata and svc_tags", CHAT, chat(metadata={"a": "1"}, svc_tags={"b": "2"})),
    ok(
        "chat: nested unknown members ignored",
        CHAT,
        chat(messages=[{"role": "user", "content": "hi", "zzz": 1}]),
    ),
    ok("chat: n 1, logprobs false, store false", CHAT, chat(n=1, logprobs=False, store=False)),
    ok("chat: empty logit_bias, text modality", CHAT, chat(logit_bias={}, modalities=["text"])),
    ok("chat: empty connectors", CHAT, chat(connectors=[], hitl_approvals=[])),
    # unsupported parameters
    bad("chat: unknown field", CHAT, chat(frobnicate=1), "unsupported_parameter", "frobnicate"),
    bad("chat: n above 1", CHAT, chat(n=2), "unsupported_parameter", "n"),
    bad("chat: logprobs true", CHAT, chat(logprobs=True), "unsupported_parameter", "logprobs"),
    bad("chat: top_logprobs", CHAT, chat(top_logprobs=2), "unsupported_parameter", "top_logprobs"),
    bad(
        "chat: non-empty logit_bias",
        CHAT,
        chat(logit_bias={"50256": -100}),
        "unsupported_parameter",
        "logit_bias",
    ),
    bad("chat: store true", CHAT, chat(store=True), "unsupported_parameter", "store"),
    bad(
        "chat: prediction",
        CHAT,
        chat(prediction={"type": "content", "content": "x"}),
        "unsupported_parameter",
        "prediction",
    ),
    bad(
        "chat: audio",
        CHAT,
        chat(audio={"voice": "alloy", "format": "mp3"}),
        "unsupported_parameter",
        "audio",
    ),
    bad(
        "chat: audio modality",
        CHAT,
        chat(modalities=["text", "audio"]),
        "unsupported_parameter",
        "modalities",
    ),
    bad(
        "chat: tool_choice required",
        CHAT,
        chat(tools=[TOOL], tool_choice="required"),
        "unsupported_parameter",
        "tool_choice",
    ),
    bad(
        "chat: tool_choice naming a function",
        CHAT,
        chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "f"}}),
        "unsupported_parameter",
        "tool_choice",
    ),
    bad(
        "chat: legacy functions",
        CHAT,
        chat(functions=[{"name": "f", "parameters": {}}]),
        "unsupported_parameter",
        "functions",
    ),
    bad(
        "chat: legacy function_call",
        CHAT,
        chat(function_call="auto"),
        "unsupported_parameter",
        "function_call",
    ),
    bad(
        "chat: connectors",
        CHAT,
        chat(connectors=[{"id": "c"}]),
        "connectors_require_user_session",
        "connectors",
    ),
    bad(
        "chat: hitl_approvals",
        CHAT,
        chat(hitl_approvals=[{"id": "h"}]),
        "connectors_require_user_session",
        "hitl_approvals",
    ),
    # body
    bad("chat: body not an object", CHAT, [1, 2], "invalid_request", None),
]

RESPONSES_ROWS = [
    bad("responses: model missing", RESP, {"input": "hi"}, "invalid_request", "model"),
    bad("responses: model not a string", RESP, resp(model=[MODEL]), "invalid_request", "model"),
    bad("responses: input missing", RESP, {"model": MODEL}, "invalid_input", "input"),
    bad("responses: input a number", RESP, resp(input=5), "invalid_input", "input"),
    bad("responses: input empty", RESP, resp(input=[]), "invalid_input", "input"),
    bad(
        "responses: input item of unknown type",
        RESP,
        resp(input=[{"type": "bogus"}]),
        "invalid_input",
        "input",
    ),
    ok(
        "responses: input items with developer role",
        RESP,
        resp(
            input=[
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            ]
        ),
    ),
    bad(
        "responses: max_output_tokens 0",
        RESP,
        resp(max_output_tokens=0),
        "invalid_request",
        "max_output_tokens",
    ),
    bad(
        "responses: max_output_tokens above the key limit",
        RESP,
        resp(max_output_tokens=4097),
        "max_tokens_exceeds_key_limit",
        "max_output_tokens",
    ),
    bad(
        "responses: max_output_tokens beyond 64 bits",
        RESP,
        resp(max_output_tokens=10**20),
        "max_tokens_exceeds_key_limit",
        "max_output_tokens",
    ),
    bad(
        "responses: model null",
        RESP,
        {"model": None, "input": "hi"},
        "invalid_request",
        "model",
    ),
    ok("responses: max_output_tokens", RESP, resp(max_output_tokens=16)),
    bad(
        "responses: text.format malformed, param response_format",
        RESP,
        resp(text={"format": {"type": "xml"}}),
        "invalid_request",
        "response_format",
    ),
    bad(
        "responses: text.format on a model without structured output",
        RESP,
        resp(model=BASIC, text=TEXT_SCHEMA),
        "model_lacks_structured_output",
        "response_format",
    ),
    ok("responses: text.format json_schema", RESP, resp(text=TEXT_SCHEMA)),
    ok(
        "responses: reasoning and text.verbosity, nested unknown members",
        RESP,
        resp(reasoning={"effort": "low", "zzz": 1}, text={"verbosity": "low", "zzz": 1}),
    ),
    bad(
        "responses: function tool on a model without tools",
        RESP,
        resp(model=BASIC, tools=[RESP_TOOL]),
        "model_lacks_tools",
        "tools",
    ),
    ok("responses: function tool", RESP, resp(tools=[RESP_TOOL])),
    bad(
        "responses: web_search on a model without it",
        RESP,
        resp(model=BASIC, tools=[{"type": "web_search"}]),
        "web_search_unavailable",
        "tools",
    ),
    ok(
        "responses: web_search tool, ignored by the mock under its chat name",
        RESP,
        resp(tools=[{"type": "web_search"}]),
        ignored=("web_search_options",),
    ),
    bad(
        "responses: image on a model without vision",
        RESP,
        resp(model=BASIC, input=IMAGE_INPUT),
        "model_lacks_vision",
        "input",
    ),
    bad(
        "responses: tool type other than function and web_search",
        RESP,
        resp(tools=[{"type": "file_search", "vector_store_ids": ["vs"]}]),
        "unsupported_parameter",
        "tools",
    ),
    ok("responses: tool_choice auto", RESP, resp(tools=[RESP_TOOL], tool_choice="auto")),
    bad(
        "responses: tool_choice required",
        RESP,
        resp(tools=[RESP_TOOL], tool_choice="required"),
        "unsupported_parameter",
        "tool_choice",
    ),
    ok("responses: user", RESP, resp(user="u-1")),
    ok("responses: parallel_tool_calls", RESP, resp(tools=[RESP_TOOL], parallel_tool_calls=True)),
    ok("responses: service_tier", RESP, resp(service_tier="auto")),
    ok("responses: tags", RESP, resp(metadata={"a": "1"}, svc_tags={"b": "2"})),
    bad("responses: stream not a boolean", RESP, resp(stream=1), "invalid_request", "stream"),
    bad(
        "responses: temperature above 2",
        RESP,
        resp(temperature=3),
        "invalid_request",
        "temperature",
    ),
    # unsupported parameters
    bad("responses: unknown field", RESP, resp(messages=USER), "unsupported_parameter", "messages"),
    bad("responses: store true", RESP, resp(store=True), "unsupported_parameter", "store"),
    bad(
        "responses: previous_response_id",
        RESP,
        resp(previous_response_id="resp_1"),
        "unsupported_parameter",
        "previous_response_id",
    ),
    bad(
        "responses: item_reference input",
        RESP,
        resp(input=[{"type": "item_reference", "id": "msg_1"}]),
        "unsupported_parameter",
        "input",
    ),
    bad(
        "responses: input_file input",
        RESP,
        resp(input=[{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]),
        "unsupported_parameter",
        "input",
    ),
    bad(
        "responses: truncation auto",
        RESP,
        resp(truncation="auto"),
        "unsupported_parameter",
        "truncation",
    ),
    bad(
        "responses: background true",
        RESP,
        resp(background=True),
        "unsupported_parameter",
        "background",
    ),
    bad(
        "responses: top_logprobs",
        RESP,
        resp(top_logprobs=1),
        "unsupported_parameter",
        "top_logprobs",
    ),
    bad(
        "responses: stream_options",
        RESP,
        resp(stream_options={"include_usage": True}),
        "unsupported_parameter",
        "stream_options",
    ),
    bad(
        "responses: connectors",
        RESP,
        resp(connectors=[{"id": "c"}]),
        "connectors_require_user_session",
        "connectors",
    ),
    bad(
        "responses: hitl_approvals",
        RESP,
        resp(hitl_approvals=[{"id": "h"}]),
        "connectors_require_user_session",
        "hitl_approvals",
    ),
]

EMBEDDINGS_ROWS = [
    bad("embeddings: model missing", EMB, {"input": "hi"}, "invalid_request", "model"),
    bad(
        "embeddings: a chat model is not the served one",
        EMB,
        emb(model=MODEL),
        "model_not_allowed",
        "model",
    ),
    bad("embeddings: input missing", EMB, {"model": EMBED}, "invalid_request", "input"),
    bad("embeddings: input empty", EMB, emb(input=""), "invalid_request", "input"),
    bad("embeddings: input of mixed types", EMB, emb(input=["a", 1]), "invalid_request", "input"),
    bad(
        "embeddings: encoding_format unknown",
        EMB,
        emb(encoding_format="int8"),
        "invalid_request",
        "encoding_format",
    ),
    bad("embeddings: dimensions 0", EMB, emb(dimensions=0), "invalid_request", "dimensions"),
    ok("embeddings: base64 and dimensions", EMB, emb(encoding_format="base64", dimensions=8)),
    ok("embeddings: token arrays", EMB, emb(input=[[1, 2, 3], [4]])),
    ok("embeddings: any other field ignored", EMB, emb(user="u", frobnicate={"x": 1})),
]


def per_endpoint(name: str, make: Any) -> list[Row]:
    """A row of the tag and key rules on each of the three endpoints."""
    bodies = (("chat", CHAT, chat), ("responses", RESP, resp), ("embeddings", EMB, emb))
    return [make(f"{label}: {name}", path, body) for label, path, body in bodies]


TAG_ROWS = [
    *per_endpoint(
        "17 tags in the header",
        lambda c, p, b: bad(
            c, p, b(), "invalid_tags", "X-Svc-Tags", headers={"X-Svc-Tags": header_tags(17)}
        ),
    ),
    *per_endpoint(
        "17 tags in metadata",
        lambda c, p, b: bad(c, p, b(metadata=tags(17)), "invalid_tags", "metadata"),
    ),
    *per_endpoint(
        "17 tags in svc_tags",
        lambda c, p, b: bad(c, p, b(svc_tags=tags(17)), "invalid_tags", "svc_tags"),
    ),
    *per_endpoint(
        "a value of 201 characters",
        lambda c, p, b: bad(c, p, b(svc_tags={"a": "x" * 201}), "invalid_tags", "svc_tags"),
    ),
    *per_endpoint(
        "a header value with CR LF (header injection)",
        lambda c, p, b: bad(
            c,
            p,
            b(),
            "invalid_tags",
            "X-Svc-Tags",
            headers={"X-Svc-Tags": "t=a%0D%0AX-Injected:%201"},
        ),
    ),
    *per_endpoint(
        "a metadata value with a C1 control",
        lambda c, p, b: bad(c, p, b(metadata={"t": "a\x9bb"}), "invalid_tags", "metadata"),
    ),
    *per_endpoint(
        "a svc_tags value with U+2028",
        lambda c, p, b: bad(c, p, b(svc_tags={"t": "a\u2028b"}), "invalid_tags", "svc_tags"),
    ),
    *per_endpoint(
        "16 tags with values of 200 characters",
        lambda c, p, b: ok(c, p, b(svc_tags={f"t{i}": "x" * 200 for i in range(16)})),
    ),
    bad(
        "chat: 9 header tags and 8 metadata tags are 17",
        CHAT,
        chat(metadata=tags(8)),
        "invalid_tags",
        "metadata",
        headers={"X-Svc-Tags": header_tags(9)},
    ),
    bad(
        "chat: header segment without =",
        CHAT,
        chat(),
        "invalid_tags",
        "X-Svc-Tags",
        headers={"X-Svc-Tags": "team"},
    ),
    bad("chat: metadata not an object", CHAT, chat(metadata=["a"]), "invalid_tags", "metadata"),
    bad(
        "responses: metadata value not a string",
        RESP,
        resp(metadata={"a": 1}),
        "invalid_tags",
        "metadata",
    ),
    bad("chat: tag key malformed", CHAT, chat(svc_tags={"a b": "c"}), "invalid_tags", "svc_tags"),
    *per_endpoint(
        "a required tag is missing",
        lambda c, p, b: bad(
            c,
            p,
            b(svc_tags={"team": "a"}),
            "missing_tags",
            None,
            key={"required_tags": {"team": "", "project": ""}},
            message_has=("project",),
        ),
    ),
    bad(
        "chat: a required tag with another value",
        CHAT,
        chat(metadata={"env": "dev"}),
        "missing_tags",
        None,
        key={"required_tags": {"env": "prod"}},
        message_has=("env=prod",),
    ),
    *per_endpoint(
        "required tags from header, body and defaults",
        lambda c, p, b: ok(
            c,
            p,
            b(metadata={"project": "p"}),
            headers={"X-Svc-Tags": "team=a"},
            key={
                "required_tags": {"team": "", "project": "", "env": ""},
                "default_tags": {"env": "dev"},
            },
        ),
    ),
]

KEY_ROWS = [
    *per_endpoint(
        "unknown model",
        lambda c, p, b: Row(c, p, b(model="no-such-model"), 404, "model_not_found", "model"),
    ),
    Row(
        "chat: a model outside the key's allowed models",
        CHAT,
        chat(),
        403,
        "model_not_allowed",
        "model",
        key={"allowed_models": ["gpt-4o"]},
    ),
    Row(
        "responses: a model outside the key's allowed models",
        RESP,
        resp(),
        403,
        "model_not_allowed",
        "model",
        key={"allowed_models": ["gpt-4o"]},
    ),
    Row(
        "embeddings: the embedding model outside the key's allowed models",
        EMB,
        emb(),
        403,
        "model_not_allowed",
        "model",
        key={"allowed_models": ["gpt-4o"]},
    ),
    ok(
        "chat: a model inside the key's allowed models",
        CHAT,
        chat(),
        key={"allowed_models": [MODEL]},
    ),
    *per_endpoint(
        "confidential key",
        lambda c, p, b: Row(
            c, p, b(), 501, "not_implemented", None, key={"data_mode": "confidential"}
        ),
    ),
    bad(
        "chat: zero_retention key on a model without it",
        CHAT,
        chat(model=BASIC),
        "model_not_zdr",
        "model",
        key={"data_mode": "zero_retention"},
    ),
    bad(
        "responses: zero_retention key on a model without it",
        RESP,
        resp(model=BASIC),
        "model_not_zdr",
        "model",
        key={"data_mode": "zero_retention"},
    ),
    ok(
        "chat: zero_retention key on a zero-retention model",
        CHAT,
        chat(),
        key={"data_mode": "zero_retention"},
    ),
    ok("embeddings: zero_retention key", EMB, emb(), key={"data_mode": "zero_retention"}),
    Row("chat: no key", CHAT, chat(), 401, "invalid_api_key", None, key={"token": None}),
    Row(
        "chat: an embeddings-only key",
        CHAT,
        chat(),
        403,
        "scope_denied",
        None,
        key={"scopes": ["embeddings"]},
    ),
    Row(
        "embeddings: an inference-only key",
        EMB,
        emb(),
        403,
        "scope_denied",
        None,
        key={"scopes": ["inference"]},
    ),
]

ROWS = CHAT_ROWS + RESPONSES_ROWS + EMBEDDINGS_ROWS + TAG_ROWS + KEY_ROWS
# refusals of admission itself carry no rate-limit headers
NO_RATE_HEADERS = {"invalid_api_key", "scope_denied", "invalid_tags", "missing_tags"}


async def token_for(gw: Gateway, settings: dict[str, Any] | None) -> str | None:
    if settings is None:
        return gw.token
    if "token" in settings:
        return settings["token"]
    return (await gw.create_key(**settings))["token"]


async def send(
    gw: Gateway, token: str | None, path: str, body: Any, headers: dict[str, str] | None = None
) -> httpx.Response:
    with trio.fail_after(10):
        async with gw.client(token, verify=False) as client:  # plain HTTP on loopback
            return await client.post(
                path,
                # the standard library writes integers beyond 64 bits, orjson does not
                content=json.dumps(body).encode(),
                headers={"Content-Type": "application/json", **(headers or {})},
            )


def check_error(response: httpx.Response, status: int, code: str, param: str | None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    assert error["type"] == ERROR_TYPES[status], error
    assert error["param"] == param, error
    assert isinstance(error["message"], str) and error["message"]
    return response.json()


@pytest.mark.parametrize("row", ROWS, ids=[row.case for row in ROWS])
async def test_request_table(gateway: Gateway, row: Row) -> None:
    token = await token_for(gateway, row.key)
    response = await send(gateway, token, row.path, row.body, row.headers)
    request_id = response.headers.get("X-Request-Id", "")
    assert request_id.startswith("req_")
    if row.code is None:
        assert response.status_code == 200, response.text
        svc = response.json()["svc"]
        assert svc["request_id"] == request_id
        assert svc["ignored_parameters"] == list(row.ignored)
        assert response.headers[RATE_HEADER] == "60"
        return
    answer = check_error(response, row.status, row.code, row.param)
    for text in row.message_has:
        assert text in answer["error"]["message"]
    assert (RATE_HEADER in response.headers) is (row.code not in NO_RATE_HEADERS)
    if row.code in ("model_not_found", "model_not_allowed") and row.status in (403, 404):
        rule = "unknown_model" if row.status == 404 else "key_allowed_models"
        assert answer["svc"] == {
            "request_id": request_id,
            "policy": {"decisions": [{"rule": rule, "verdict": "deny"}]},
        }
    else:
        assert "svc" not in answer
    # refused before the model was called: no request record
    assert await stored(gateway, request_id) is None


async def stored(gw: Gateway, request_id: str) -> dict[str, Any] | None:
    rows = await gw.runtime.store.read(
        lambda conn: conn.execute("SELECT * FROM requests WHERE id = ?", (request_id,)).fetchall()
    )
    if not rows:
        return None
    row = dict(rows[0])
    row["tags"] = orjson.loads(row["tags"]) if row["tags"] else {}
    return row


@pytest.mark.parametrize(
    ("path", "body"),
    [(CHAT, chat()), (RESP, resp()), (EMB, emb())],
    ids=["chat", "responses", "embeddings"],
)
async def test_default_tags_merge_and_the_caller_wins(
    gateway: Gateway, path: str, body: dict[str, Any]
) -> None:
    key = await gateway.create_key(
        default_tags={"env": "dev", "team": "core", "cost": "c1"},
        required_tags={"team": ""},
    )
    body = {**body, "metadata": {"cost": "c2", "m": "1"}, "svc_tags": {"s": "2"}}
    response = await send(gateway, key["token"], path, body, {"X-Svc-Tags": "team=web,h=a%20b"})
    assert response.status_code == 200, response.text
    record = await stored(gateway, response.headers["X-Request-Id"])
    assert record is not None
    assert record["tags"] == {
        "env": "dev",  # default, not sent
        "team": "web",  # default overridden by the header
        "cost": "c2",  # default overridden by metadata
        "m": "1",
        "s": "2",
        "h": "a b",  # percent-decoded
    }
    assert record["key_id"] == key["id"]
    assert record["mode"] == "sandbox"


@pytest.mark.parametrize(
    ("path", "body", "budget"),
    [
        (CHAT, chat(), {}),
        (CHAT, chat(max_tokens=10), {"max_tokens": 10}),
        (CHAT, chat(max_completion_tokens=10, max_tokens=20), {"max_tokens": 10}),
        (RESP, resp(), {}),
        (RESP, resp(max_output_tokens=10), {"max_tokens": 10}),
    ],
    ids=[
        "chat omitted",
        "chat max_tokens",
        "chat both budgets",
        "responses omitted",
        "responses max_output_tokens",
    ],
)
async def test_the_reservation_counts_the_output_ceiling(
    clocked_gateway: Gateway, path: str, body: dict[str, Any], budget: dict[str, int]
) -> None:
    """tokens_this_minute counts prompt estimate + full output ceiling; an omitted budget
    is the key's maximum output tokens (here 1000), and the smaller of two budgets wins."""
    gw = clocked_gateway
    limit = 1000
    ceiling = budget.get("max_tokens", limit)
    key = await gw.create_key(caps={"max_output_tokens": limit})
    response = await send(gw, key["token"], path, body)
    assert response.status_code == 200, response.text
    async with gw.client(key["token"], verify=False) as client:
        view = (await client.get("/v1/key")).json()
    counted = view["rate_limit"]["tokens_this_minute"]
    # the prompt share is the same estimate for every row of one endpoint: recompute it
    # from an explicit budget of 1 on a fresh key
    probe = await gw.create_key(caps={"max_output_tokens": limit})
    base = {
        k: v
        for k, v in body.items()
        if k not in ("max_tokens", "max_completion_tokens", "max_output_tokens")
    }
    field_name = "max_tokens" if path == CHAT else "max_output_tokens"
    assert (await send(gw, probe["token"], path, {**base, field_name: 1})).status_code == 200
    async with gw.client(probe["token"], verify=False) as client:
        prompt_estimate = (await client.get("/v1/key")).json()["rate_limit"][
            "tokens_this_minute"
        ] - 1
    assert prompt_estimate > 0
    assert counted == prompt_estimate + ceiling
