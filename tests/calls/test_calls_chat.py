"""POST /v1/chat/completions body rules: one row per rule of the spec, code and param asserted.

Pure functions, no server: ``parse_chat`` and ``check_capabilities`` on parsed JSON.
"""

from __future__ import annotations

from typing import Any, Literal

import pytest

from gateway.accounts.catalog import Model
from gateway.calls.parse import ChatCall
from gateway.calls.parse.chat import CHAT_FIELDS, check_capabilities, parse_chat
from gateway.config.settings import ModelConfig
from gateway.errors import GatewayError

LIMIT = 4096
USER = [{"role": "user", "content": "hi"}]
IMAGE = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        ],
    }
]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": USER, **fields}


def refused(payload: Any, limit: int = LIMIT) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        parse_chat(payload, limit)
    return caught.value


# (case, body, code, param) — the rows of the spec's chat table, 400 table and
# "Unsupported parameters" list.
REFUSALS: list[tuple[str, Any, str, str | None]] = [
    ("body not an object", [1, 2], "invalid_request", None),
    ("model missing", {"messages": USER}, "validation_failed", "model"),
    ("model null", {"model": None, "messages": USER}, "validation_failed", "model"),
    ("model not a string", body(model=5), "invalid_request", "model"),
    ("model empty", body(model=""), "invalid_request", "model"),
    ("messages missing", {"model": "m"}, "invalid_messages", "messages"),
    ("messages empty", body(messages=[]), "invalid_messages", "messages"),
    ("messages not an array", body(messages="hi"), "invalid_messages", "messages"),
    ("message not an object", body(messages=["hi"]), "invalid_messages", "messages"),
    ("role developer", body(messages=[{"role": "developer", "content": "x"}]),
     "invalid_messages", "messages"),
    ("role unknown", body(messages=[{"role": "bot", "content": "x"}]),
     "invalid_messages", "messages"),
    ("role not a string", body(messages=[{"role": ["user"], "content": "x"}]),
     "invalid_messages", "messages"),
    ("role missing", body(messages=[{"content": "x"}]), "invalid_messages", "messages"),
    ("content missing", body(messages=[{"role": "user"}]), "invalid_messages", "messages"),
    ("content null on user", body(messages=[{"role": "user", "content": None}]),
     "invalid_messages", "messages"),
    ("content a number", body(messages=[{"role": "user", "content": 3}]),
     "invalid_messages", "messages"),
    ("content empty parts", body(messages=[{"role": "user", "content": []}]),
     "invalid_messages", "messages"),
    ("content part untyped", body(messages=[{"role": "user", "content": [{"text": "x"}]}]),
     "invalid_messages", "messages"),
    ("null content, no tool_calls", body(messages=[{"role": "assistant", "content": None}]),
     "invalid_messages", "messages"),
    ("temperature above 2", body(temperature=2.5), "invalid_request", "temperature"),
    ("temperature below 0", body(temperature=-0.1), "invalid_request", "temperature"),
    ("temperature a string", body(temperature="1"), "invalid_request", "temperature"),
    ("temperature a boolean", body(temperature=True), "invalid_request", "temperature"),
    ("top_p above 1", body(top_p=1.01), "invalid_request", "top_p"),
    ("top_p a string", body(top_p="0.5"), "invalid_request", "top_p"),
    ("max_tokens zero", body(max_tokens=0), "invalid_request", "max_tokens"),
    ("max_tokens negative", body(max_tokens=-5), "invalid_request", "max_tokens"),
    ("max_tokens a fraction", body(max_tokens=10.5), "invalid_request", "max_tokens"),
    ("max_tokens beyond an exact float", body(max_tokens=2.0**60), "invalid_request",
     "max_tokens"),
    ("max_tokens a boolean", body(max_tokens=True), "invalid_request", "max_tokens"),
    ("max_completion_tokens zero", body(max_completion_tokens=0),
     "invalid_request", "max_completion_tokens"),
    ("max_completion_tokens a string", body(max_completion_tokens="9"),
     "invalid_request", "max_completion_tokens"),
    ("five stop sequences", body(stop=["a", "b", "c", "d", "e"]), "invalid_request", "stop"),
    ("stop a number", body(stop=3), "invalid_request", "stop"),
    ("stop array of numbers", body(stop=[1]), "invalid_request", "stop"),
    ("seed a float", body(seed=1.5), "invalid_request", "seed"),
    ("seed a string", body(seed="1"), "invalid_request", "seed"),
    ("seed a boolean", body(seed=False), "invalid_request", "seed"),
    ("stream a string", body(stream="yes"), "invalid_request", "stream"),
    ("stream_options not an object", body(stream_options=True),
     "invalid_request", "stream_options"),
    ("user not a string", body(user=5), "invalid_request", "user"),
    ("service_tier not a string", body(service_tier=1), "invalid_request", "service_tier"),
    ("parallel_tool_calls not a boolean", body(parallel_tool_calls="yes"),
     "invalid_request", "parallel_tool_calls"),
    ("response_format unknown type", body(response_format={"type": "xml"}),
     "invalid_request", "response_format"),
    ("response_format not an object", body(response_format="json"),
     "invalid_request", "response_format"),
    ("tools not an array", body(tools={"a": 1}), "invalid_request", "tools"),
    ("tools of strings", body(tools=["f"]), "invalid_request", "tools"),
    ("web_search_options not an object", body(web_search_options=True),
     "invalid_request", "web_search_options"),
    ("max_tokens above the key limit", body(max_tokens=LIMIT + 1),
     "max_tokens_exceeds_key_limit", "max_tokens"),
    ("max_completion_tokens above the key limit: param max_tokens",
     body(max_completion_tokens=LIMIT + 1), "max_tokens_exceeds_key_limit", "max_tokens"),
    ("both sent, one above the key limit", body(max_tokens=10, max_completion_tokens=LIMIT + 1),
     "max_tokens_exceeds_key_limit", "max_tokens"),
    ("n above 1", body(n=2), "unsupported_parameter", "n"),
    ("n zero", body(n=0), "invalid_request", "n"),
    ("logprobs true", body(logprobs=True), "unsupported_parameter", "logprobs"),
    ("logprobs a string", body(logprobs="true"), "invalid_request", "logprobs"),
    ("top_logprobs", body(top_logprobs=2), "unsupported_parameter", "top_logprobs"),
    ("top_logprobs zero", body(top_logprobs=0), "unsupported_parameter", "top_logprobs"),
    ("non-empty logit_bias", body(logit_bias={"50256": -100}),
     "unsupported_parameter", "logit_bias"),
    ("store true", body(store=True), "unsupported_parameter", "store"),
    ("prediction", body(prediction={"type": "content", "content": "x"}),
     "unsupported_parameter", "prediction"),
    ("audio", body(audio={"voice": "alloy", "format": "wav"}), "unsupported_parameter", "audio"),
    ("modalities audio", body(modalities=["text", "audio"]),
     "unsupported_parameter", "modalities"),
    ("modalities empty", body(modalities=[]), "unsupported_parameter", "modalities"),
    ("tool_choice required", body(tools=[TOOL], tool_choice="required"),
     "unsupported_parameter", "tool_choice"),
    ("tool_choice a named function",
     body(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "f"}}),
     "unsupported_parameter", "tool_choice"),
    ("functions", body(functions=[{"name": "f"}]), "unsupported_parameter", "functions"),
    ("function_call", body(function_call="auto"), "unsupported_parameter", "function_call"),
    ("unknown top-level field", body(frobnicate=1), "unsupported_parameter", "frobnicate"),
    ("developer-style field reasoning", body(reasoning={"effort": "low"}),
     "unsupported_parameter", "reasoning"),
    ("responses field input", body(input="hi"), "unsupported_parameter", "input"),
    ("non-empty connectors", body(connectors=[{"id": "c"}]),
     "connectors_require_user_session", "connectors"),
    ("non-empty hitl_approvals", body(hitl_approvals={"a": 1}),
     "connectors_require_user_session", "hitl_approvals"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("payload", "code", "param"),
    [row[1:] for row in REFUSALS],
    ids=[row[0] for row in REFUSALS],
)
def test_refusals(payload: Any, code: str, param: str | None) -> None:
    error = refused(payload)
    assert (error.code, error.param, error.status) == (code, param, 400)


# Precedence: which of two faults answers (module docstring of gateway.calls.parse.chat).
PRECEDENCE: list[tuple[str, dict[str, Any], str, str | None]] = [
    ("unknown field before missing model", {"messages": USER, "zzz": 1},
     "unsupported_parameter", "zzz"),
    ("model before messages", {"messages": []}, "validation_failed", "model"),
    ("messages before values", body(messages=[], temperature=9), "invalid_messages", "messages"),
    ("connectors before unsupported values", body(connectors=["x"], n=3),
     "connectors_require_user_session", "connectors"),
    ("unsupported before invalid values", body(temperature=9, store=True),
     "unsupported_parameter", "store"),
    ("invalid budget before the key limit", body(max_tokens=LIMIT + 1, seed="x"),
     "invalid_request", "seed"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("payload", "code", "param"),
    [row[1:] for row in PRECEDENCE],
    ids=[row[0] for row in PRECEDENCE],
)
def test_precedence(payload: dict[str, Any], code: str, param: str | None) -> None:
    error = refused(payload)
    assert (error.code, error.param) == (code, param)


def test_minimal_body() -> None:
    call = parse_chat(body(), LIMIT)
    assert call == ChatCall(
        model="m", messages=USER, max_tokens=LIMIT, stream=False, include_usage=False,
        params={}, needs=frozenset(), endpoint="chat",
    )  # fmt: skip


def test_every_top_level_null_is_a_field_not_sent() -> None:
    """Wrappers that send null for every argument left out (refused-on-presence fields and
    real OpenAI fields this gateway does not serve included) get the minimal call."""
    nulls = dict.fromkeys(CHAT_FIELDS - {"model", "messages"})
    nulls |= dict.fromkeys(("presence_penalty", "frequency_penalty", "a_typo"))
    assert parse_chat(body(**nulls), LIMIT) == parse_chat(body(), LIMIT)


def test_a_forcing_tool_choice_names_what_works_instead() -> None:
    error = refused(body(tools=[TOOL], tool_choice="required"))
    assert error.code == "unsupported_parameter" and error.message is not None
    assert "response_format with type json_schema" in error.message
    assert "tool_choice auto" in error.message


def test_an_unknown_parameter_is_not_supported_by_this_gateway() -> None:
    error = refused(body(presence_penalty=0.5))
    assert error.param == "presence_penalty"
    assert error.message is not None
    assert error.message.startswith(
        "The parameter presence_penalty is not supported by this gateway; the fields it knows:"
    )
    assert "max_tokens, messages, metadata" in error.message  # the list, sorted


# Fields accepted with no effect: each is accepted and forwards nothing.
NO_EFFECT: list[tuple[str, Any]] = [
    ("user", "u-1"),
    ("stream_options", {"include_usage": False}),
    ("parallel_tool_calls", False),
    ("service_tier", "flex"),
    ("metadata", {"team": "a"}),
    ("svc_tags", {"team": "a"}),
    ("n", 1),
    ("logprobs", False),
    ("logit_bias", {}),
    ("store", False),
    ("modalities", ["text"]),
    ("tool_choice", "auto"),
    ("tool_choice", "none"),
    ("connectors", []),
    ("hitl_approvals", {}),
    ("connectors", None),
    ("response_format", {"type": "text"}),
    ("tools", []),
    ("temperature", None),
]


@pytest.mark.parametrize(("name", "value"), NO_EFFECT, ids=[f"{n}={v!r}" for n, v in NO_EFFECT])
def test_accepted_without_effect(name: str, value: Any) -> None:
    call = parse_chat(body(**{name: value}), LIMIT)
    assert call.needs == frozenset()
    assert call.params == {}


def test_an_assistant_turn_of_only_a_refusal_is_read() -> None:
    earlier = {"role": "assistant", "content": None, "refusal": "I can't help with that."}
    messages = [*USER, earlier, {"role": "user", "content": "ok"}]
    assert parse_chat(body(messages=messages), LIMIT).messages[1] == earlier


def test_forwarded_params_use_chat_names() -> None:
    call = parse_chat(
        body(
            temperature=0, top_p=1, stop=["a", "b", "c", "d"], seed=7, user="u",
            tools=[TOOL], tool_choice="none", parallel_tool_calls=False,
            response_format=SCHEMA, web_search_options={"search_context_size": "low"},
            service_tier="flex", metadata={"a": "b"},
        ),
        LIMIT,
    )  # fmt: skip
    assert call.params == {
        "temperature": 0,
        "top_p": 1,
        "stop": ["a", "b", "c", "d"],
        "seed": 7,
        "tools": [TOOL],
        "tool_choice": "none",
        "parallel_tool_calls": False,
        "response_format": SCHEMA,
        "web_search_options": {"search_context_size": "low"},
    }
    assert call.needs == {"tools", "structured_output", "web_search"}


def test_tool_choice_and_parallel_calls_need_tools() -> None:
    call = parse_chat(body(tool_choice="none", parallel_tool_calls=True), LIMIT)
    assert call.params == {}


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, LIMIT),
        ({"max_tokens": 100}, 100),
        ({"max_completion_tokens": 200}, 200),
        ({"max_tokens": 300, "max_completion_tokens": 50}, 50),
        ({"max_tokens": LIMIT}, LIMIT),
        ({"max_tokens": None}, LIMIT),
        # JSON Schema's integer admits a zero fraction: read as the integer it names
        ({"max_tokens": 100.0, "max_completion_tokens": 200.0}, 100),
    ],
)
def test_output_budget(fields: dict[str, Any], expected: int) -> None:
    call = parse_chat(body(**fields), LIMIT)
    assert call.max_tokens == expected
    assert call.body()["max_tokens"] == expected
    assert "max_completion_tokens" not in call.body()


def test_whole_numbers_with_a_fraction_are_integers() -> None:
    """``7.0`` is read as 7 and forwarded as 7 (n, seed); ``7.5`` stays refused."""
    call = parse_chat(body(seed=7.0, n=1.0), LIMIT)
    assert call.body()["seed"] == 7 and isinstance(call.body()["seed"], int)
    assert refused(body(n=1.5), LIMIT).param == "n"


def test_key_limit_comes_from_the_caller() -> None:
    assert parse_chat(body(), 256).max_tokens == 256
    assert refused(body(max_tokens=257), 256).code == "max_tokens_exceeds_key_limit"


def test_stream_and_include_usage() -> None:
    call = parse_chat(body(stream=True, stream_options={"include_usage": True}), LIMIT)
    assert (call.stream, call.include_usage) == (True, True)
    upstream = call.body()
    assert upstream["stream"] is True
    assert upstream["stream_options"] == {"include_usage": True}
    quiet = parse_chat(body(stream=True), LIMIT)
    assert (quiet.stream, quiet.include_usage) == (True, False)
    assert quiet.body()["stream_options"] == {"include_usage": True}  # upstream: always
    assert "stream" not in parse_chat(body(stream=False), LIMIT).body()


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
        [{"role": "user", "content": [{"type": "text", "text": "x"}]}],
        [
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
            {"role": "tool", "content": "42", "tool_call_id": "c1"},
        ],
        [{"role": "assistant", "tool_calls": [{"id": "c1"}]}],
        [{"role": "user", "content": "", "name": "ann", "unknown_member": {"x": 1}}],
    ],
)
def test_valid_messages(messages: list[dict[str, Any]]) -> None:
    assert parse_chat(body(messages=messages), LIMIT).messages == messages


def test_nested_unknown_members_are_ignored() -> None:
    call = parse_chat(
        body(
            stream_options={"include_usage": True, "future": 1},
            web_search_options={"whatever": {"deep": True}},
            tools=[{**TOOL, "extra": 1}],
        ),
        LIMIT,
    )
    assert call.params["web_search_options"] == {"whatever": {"deep": True}}


@pytest.mark.parametrize(
    ("fields", "needs"),
    [
        ({"messages": IMAGE}, {"vision"}),
        ({"messages": [{"role": "user", "content": [{"type": "input_image"}]}]}, {"vision"}),
        ({"tools": [TOOL]}, {"tools"}),
        ({"response_format": {"type": "json_object"}}, {"structured_output"}),
        ({"response_format": SCHEMA}, {"structured_output"}),
        ({"web_search_options": {}}, {"web_search"}),
        ({"messages": IMAGE, "tools": [TOOL]}, {"vision", "tools"}),
    ],
)
def test_needs(fields: dict[str, Any], needs: set[str]) -> None:
    assert parse_chat(body(**fields), LIMIT).needs == needs


def model(*capabilities: str, kind: str = "chat") -> Model:
    return Model(
        ModelConfig(id="m", provider="mock", upstream_id="m", kind=kind, capabilities=capabilities)
    )


ALL = ("vision", "tools", "structured_output", "web_search")

# (needs, endpoint, code, param): the capability rows of the 400 table.
CAPABILITY_REFUSALS = [
    ({"vision"}, "chat", "model_lacks_vision", "messages"),
    ({"vision"}, "responses", "model_lacks_vision", "input"),
    ({"tools"}, "chat", "model_lacks_tools", "tools"),
    ({"tools"}, "responses", "model_lacks_tools", "tools"),
    ({"structured_output"}, "chat", "model_lacks_structured_output", "response_format"),
    ({"structured_output"}, "responses", "model_lacks_structured_output", "response_format"),
    ({"web_search"}, "chat", "web_search_unavailable", "web_search_options"),
    ({"web_search"}, "responses", "web_search_unavailable", "tools"),
]


@pytest.mark.parametrize(("needs", "endpoint", "code", "param"), CAPABILITY_REFUSALS)
def test_capability_refusals(
    needs: set[str], endpoint: Literal["chat", "responses"], code: str, param: str
) -> None:
    call = ChatCall(
        model="m", messages=USER, max_tokens=1, needs=frozenset(needs), endpoint=endpoint
    )
    others = tuple(cap for cap in ALL if cap not in needs)
    with pytest.raises(GatewayError) as caught:
        check_capabilities(call, model(*others))
    assert (caught.value.code, caught.value.param, caught.value.status) == (code, param, 400)
    check_capabilities(call, model(*ALL))  # the capable model serves it


def test_embedding_model_on_chat_is_invalid_request() -> None:
    call = parse_chat(body(), LIMIT)
    with pytest.raises(GatewayError) as caught:
        check_capabilities(call, model(*ALL, kind="embedding"))
    assert (caught.value.code, caught.value.param) == ("invalid_request", "model")


def test_plain_call_needs_no_capability() -> None:
    check_capabilities(parse_chat(body(), LIMIT), model())
