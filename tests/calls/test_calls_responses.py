"""POST /v1/responses: body rules (one row per rule of the spec) and the translation back.

Every translated answer and stream event is validated against the official ``openai``
package's pydantic models, the types its client parses into.
"""

from __future__ import annotations

from typing import Any

import pytest
from openai import omit
from openai._models import construct_type
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from gateway.calls.parse import ChatCall
from gateway.calls.parse.responses import (
    RESPONSES_FIELDS,
    ResponseStreamTranslator,
    chat_to_response,
    parse_responses,
)
from gateway.errors import GatewayError

LIMIT = 4096
FN = {"type": "function", "name": "get_weather", "description": "Weather.",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}  # fmt: skip
SCHEMA_FORMAT = {"type": "json_schema", "name": "answer", "schema": {"type": "object"},
                 "strict": True}  # fmt: skip
EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "input": "hi", **fields}


def refused(payload: Any, limit: int = LIMIT) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        parse_responses(payload, limit)
    return caught.value


def message(content: Any, role: str = "user") -> dict[str, Any]:
    return {"type": "message", "role": role, "content": content}


# (case, body, code, param): the responses table and its "Unsupported parameters" list.
REFUSALS: list[tuple[str, Any, str, str | None]] = [
    ("body not an object", "hi", "invalid_request", None),
    ("model missing", {"input": "hi"}, "invalid_request", "model"),
    ("model null", {"model": None, "input": "hi"}, "invalid_request", "model"),
    ("model not a string", body(model=["m"]), "invalid_request", "model"),
    ("input missing", {"model": "m"}, "invalid_input", "input"),
    ("input a number", body(input=5), "invalid_input", "input"),
    ("input empty array", body(input=[]), "invalid_input", "input"),
    ("input item a string", body(input=["hi"]), "invalid_input", "input"),
    ("input item unknown type", body(input=[{"type": "reasoning", "summary": []}]),
     "invalid_input", "input"),
    ("message without role", body(input=[{"content": "x"}]), "invalid_input", "input"),
    ("message role tool", body(input=[message("x", role="tool")]), "invalid_input", "input"),
    ("message content a number", body(input=[message(5)]), "invalid_input", "input"),
    ("message content empty parts", body(input=[message([])]), "invalid_input", "input"),
    ("content part unknown", body(input=[message([{"type": "input_audio"}])]),
     "invalid_input", "input"),
    ("input_text without text", body(input=[message([{"type": "input_text"}])]),
     "invalid_input", "input"),
    ("function_call without name",
     body(input=[{"type": "function_call", "call_id": "c", "arguments": "{}"}]),
     "invalid_input", "input"),
    ("function_call_output without call_id",
     body(input=[{"type": "function_call_output", "output": "42"}]), "invalid_input", "input"),
    ("item_reference input", body(input=[{"type": "item_reference", "id": "msg_1"}]),
     "unsupported_parameter", "input"),
    ("input_file input",
     body(input=[message([{"type": "input_file", "file_id": "file_1"}])]),
     "unsupported_parameter", "input"),
    ("input_image by file id",
     body(input=[message([{"type": "input_image", "file_id": "file_1", "detail": "auto"}])]),
     "unsupported_parameter", "input"),
    ("max_output_tokens zero", body(max_output_tokens=0), "invalid_request", "max_output_tokens"),
    ("max_output_tokens a string", body(max_output_tokens="9"),
     "invalid_request", "max_output_tokens"),
    ("max_output_tokens above the key limit", body(max_output_tokens=LIMIT + 1),
     "max_tokens_exceeds_key_limit", "max_output_tokens"),
    ("text.format unknown type", body(text={"format": {"type": "xml"}}),
     "invalid_request", "response_format"),
    ("text.format json_schema without schema",
     body(text={"format": {"type": "json_schema", "name": "x"}}),
     "invalid_request", "response_format"),
    ("text.format a string", body(text={"format": "json"}), "invalid_request", "response_format"),
    ("text not an object", body(text="json"), "invalid_request", "text"),
    ("reasoning not an object", body(reasoning="high"), "invalid_request", "reasoning"),
    ("instructions not a string", body(instructions=["x"]), "invalid_request", "instructions"),
    ("temperature above 2", body(temperature=3), "invalid_request", "temperature"),
    ("top_p above 1", body(top_p=2), "invalid_request", "top_p"),
    ("stream a string", body(stream="true"), "invalid_request", "stream"),
    ("tools not an array", body(tools=FN), "invalid_request", "tools"),
    ("function tool without name", body(tools=[{"type": "function"}]), "invalid_request", "tools"),
    ("file_search tool", body(tools=[{"type": "file_search", "vector_store_ids": ["v"]}]),
     "unsupported_parameter", "tools"),
    ("web_search_preview tool", body(tools=[{"type": "web_search_preview"}]),
     "unsupported_parameter", "tools"),
    ("mcp tool", body(tools=[{"type": "mcp", "server_label": "x"}]),
     "unsupported_parameter", "tools"),
    ("tool_choice required", body(tools=[FN], tool_choice="required"),
     "unsupported_parameter", "tool_choice"),
    ("tool_choice a named function",
     body(tools=[FN], tool_choice={"type": "function", "name": "get_weather"}),
     "unsupported_parameter", "tool_choice"),
    ("store true", body(store=True), "unsupported_parameter", "store"),
    ("previous_response_id", body(previous_response_id="resp_1"),
     "unsupported_parameter", "previous_response_id"),
    ("truncation auto", body(truncation="auto"), "unsupported_parameter", "truncation"),
    ("truncation unknown", body(truncation="middle"), "invalid_request", "truncation"),
    ("include a value", body(include=["message.output_text.logprobs"]),
     "unsupported_parameter", "include"),
    ("include not an array", body(include="x"), "invalid_request", "include"),
    ("include of numbers", body(include=[5]), "invalid_request", "include"),
    ("background true", body(background=True), "unsupported_parameter", "background"),
    ("top_logprobs", body(top_logprobs=3), "unsupported_parameter", "top_logprobs"),
    ("stream_options", body(stream=True, stream_options={"include_usage": True}),
     "unsupported_parameter", "stream_options"),
    ("unknown top-level field", body(frobnicate=True), "unsupported_parameter", "frobnicate"),
    ("chat field messages", body(messages=[]), "unsupported_parameter", "messages"),
    ("chat field max_tokens", body(max_tokens=5), "unsupported_parameter", "max_tokens"),
    ("non-empty connectors", body(connectors=["c"]),
     "connectors_require_user_session", "connectors"),
    ("non-empty hitl_approvals", body(hitl_approvals=[{"tool": "x"}]),
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


def test_precedence() -> None:
    assert refused({"input": 5, "zzz": 1}).param == "zzz"
    assert refused({"input": 5}).code == "invalid_request"
    assert refused(body(input=5, store=True)).code == "invalid_input"
    assert refused(body(connectors=["c"], store=True)).code == "connectors_require_user_session"
    assert refused(body(store=True, temperature=9)).param == "store"
    assert refused(body(max_output_tokens=LIMIT + 1, temperature=9)).param == "temperature"


def test_minimal_body() -> None:
    assert parse_responses(body(), LIMIT) == ChatCall(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=LIMIT,
        endpoint="responses",
    )  # fmt: skip


def test_every_top_level_null_is_a_field_not_sent() -> None:
    nulls = dict.fromkeys(RESPONSES_FIELDS - {"model", "input"})
    nulls |= dict.fromkeys(("presence_penalty", "a_typo"))
    assert "previous_response_id" in nulls and "stream_options" in nulls
    assert parse_responses(body(**nulls), LIMIT) == parse_responses(body(), LIMIT)


def test_a_forcing_tool_choice_names_what_works_instead() -> None:
    error = refused(body(tools=[FN], tool_choice="required"))
    assert error.code == "unsupported_parameter" and error.message is not None
    assert "text.format with type json_schema" in error.message
    assert "tool_choice auto" in error.message


NO_EFFECT: list[tuple[str, Any]] = [
    ("parallel_tool_calls", True),
    ("service_tier", "auto"),
    ("metadata", {"team": "a"}),
    ("svc_tags", {"team": "a"}),
    ("stream", False),
    ("include", ["reasoning.encrypted_content"]),
    ("reasoning", {"effort": "low", "summary": "auto", "future": {"x": 1}}),
    ("text", {"verbosity": "low", "future": 1}),
    ("text", {"format": {"type": "text"}}),
    ("store", False),
    ("background", False),
    ("truncation", "disabled"),
    ("include", []),
    ("include", None),
    ("tool_choice", "auto"),
    ("tool_choice", "none"),
    ("connectors", []),
    ("hitl_approvals", None),
    ("tools", []),
]


@pytest.mark.parametrize(("name", "value"), NO_EFFECT, ids=[f"{n}={v!r}" for n, v in NO_EFFECT])
def test_accepted_without_effect(name: str, value: Any) -> None:
    call = parse_responses(body(**{name: value}), LIMIT)
    assert (call.params, call.needs) == ({}, frozenset())


def test_sampling_params_and_budget_use_chat_names() -> None:
    call = parse_responses(body(temperature=0.5, top_p=0.9, user="u", max_output_tokens=300), LIMIT)
    assert call.params == {"temperature": 0.5, "top_p": 0.9}, "user has no effect"
    assert call.max_tokens == 300
    upstream = call.body()
    # an ignored max_output_tokens is reported as max_tokens: that is its upstream name
    assert upstream["max_tokens"] == 300
    assert "max_output_tokens" not in upstream and "text" not in upstream


def test_text_format_becomes_response_format() -> None:
    call = parse_responses(body(text={"format": SCHEMA_FORMAT, "verbosity": "high"}), LIMIT)
    assert call.params == {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": {"type": "object"}, "strict": True},
        }
    }
    assert call.needs == {"structured_output"}
    json_object = parse_responses(body(text={"format": {"type": "json_object"}}), LIMIT)
    assert json_object.params == {"response_format": {"type": "json_object"}}


def test_tools_translate_to_chat_tools() -> None:
    call = parse_responses(
        body(tools=[FN, {"type": "web_search", "search_context_size": "low"}],
             tool_choice="auto", parallel_tool_calls=False),
        LIMIT,
    )  # fmt: skip
    assert call.params == {
        "tools": [{"type": "function", "function": {
            "name": "get_weather", "description": "Weather.", "parameters": FN["parameters"]}}],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "web_search_options": {"search_context_size": "low"},
    }  # fmt: skip
    assert call.needs == {"tools", "web_search"}


def test_web_search_tool_alone() -> None:
    location = {"type": "approximate", "city": "Paris", "country": "FR"}
    call = parse_responses(body(tools=[{"type": "web_search", "user_location": location}]), LIMIT)
    assert call.params == {
        "web_search_options": {
            "user_location": {
                "type": "approximate",
                "approximate": {"city": "Paris", "country": "FR"},
            }
        }
    }
    assert call.needs == {"web_search"}  # not "tools": no function tool is declared


def test_input_items_become_chat_messages() -> None:
    image = {"type": "input_image", "image_url": "https://x/y.png", "detail": "low"}
    call = parse_responses(
        body(
            instructions="Be brief.",
            input=[
                {"role": "developer", "content": "Use metric units."},
                message([{"type": "input_text", "text": "Weather?"}, image]),
                {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                 "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
                {"type": "function_call", "call_id": "c1", "name": "get_weather",
                 "arguments": '{"city":"Paris"}', "id": "fc_1"},
                {"type": "function_call_output", "call_id": "c1", "output": "18C"},
            ],
        ),
        LIMIT,
    )  # fmt: skip
    assert call.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Use metric units."},
        {"role": "user", "content": [
            {"type": "text", "text": "Weather?"},
            {"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}},
        ]},
        {"role": "assistant", "content": [{"type": "text", "text": "Checking."}], "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": "18C"},
    ]  # fmt: skip
    assert call.needs == {"vision"}


def test_function_call_without_preceding_assistant_message() -> None:
    call = parse_responses(
        body(input=[
            message("Weather?"),
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
        ]),
        LIMIT,
    )  # fmt: skip
    assistant = call.messages[1]
    assert assistant["role"] == "assistant" and assistant["content"] is None
    assert [tc["id"] for tc in assistant["tool_calls"]] == ["c1", "c2"]


# ---- translation back: chat.completion -> response ----

USAGE = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}


def completion(message: dict[str, Any], finish_reason: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1_700_000_123, "model": "up",
        "choices": [{"index": 0, "message": {"role": "assistant", **message},
                     "finish_reason": finish_reason}],
        "usage": USAGE,
    }  # fmt: skip


def validated(answer: dict[str, Any]) -> Response:
    return Response.model_validate(answer)


def test_text_answer_parses_with_the_openai_client() -> None:
    call = parse_responses(body(temperature=0.2), LIMIT)
    answer = chat_to_response(completion({"content": "Hello!"}), call, "resp_abc")
    parsed = validated(answer)
    assert parsed.id == "resp_abc" and parsed.object == "response"
    assert parsed.status == "completed" and parsed.incomplete_details is None
    assert parsed.output_text == "Hello!"
    assert parsed.output[0].id == "msg_abc"
    assert parsed.created_at == 1_700_000_123 and parsed.model == "m"
    assert parsed.temperature == 0.2 and parsed.max_output_tokens == LIMIT
    assert parsed.usage is not None
    assert (parsed.usage.input_tokens, parsed.usage.output_tokens) == (11, 7)
    assert parsed.usage.total_tokens == 18


def test_tool_calls_become_function_call_items() -> None:
    call = parse_responses(body(tools=[FN, {"type": "web_search"}]), LIMIT)
    tool_calls = [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": "{}"}},
    ]  # fmt: skip
    answer = chat_to_response(
        completion({"content": None, "tool_calls": tool_calls}, "tool_calls"), call, "resp_t"
    )
    parsed = validated(answer)
    assert [item.type for item in parsed.output] == ["function_call", "function_call"]
    first = parsed.output[0]
    assert first.type == "function_call"
    assert (first.call_id, first.name, first.arguments) == ("call_1", "get_weather",
                                                            '{"city":"Paris"}')  # fmt: skip
    assert [tool.type for tool in parsed.tools] == ["function", "web_search"]
    assert parsed.tools[0].type == "function" and parsed.tools[0].name == "get_weather"


def test_length_is_incomplete() -> None:
    call = parse_responses(body(max_output_tokens=7), LIMIT)
    parsed = validated(chat_to_response(completion({"content": "Once"}, "length"), call, "resp_l"))
    assert parsed.status == "incomplete"
    assert parsed.incomplete_details is not None
    assert parsed.incomplete_details.reason == "max_output_tokens"
    assert parsed.output[0].type == "message" and parsed.output[0].status == "incomplete"


def test_refusal_and_structured_output_echo() -> None:
    call = parse_responses(body(text={"format": SCHEMA_FORMAT}), LIMIT)
    answer = chat_to_response(completion({"content": None, "refusal": "No."}), call, "resp_r")
    parsed = validated(answer)
    assert parsed.output[0].type == "message"
    assert [part.type for part in parsed.output[0].content] == ["refusal"]
    assert parsed.text is not None and parsed.text.format is not None
    assert parsed.text.format.type == "json_schema"
    assert answer["text"]["format"]["name"] == "answer"


def test_no_usage_reported() -> None:
    call = parse_responses(body(), LIMIT)
    bare = {**completion({"content": "x"}), "usage": None}
    assert validated(chat_to_response(bare, call, "resp_u")).usage is None


# ---- translation back: chunks -> Responses stream events ----


def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "up",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}  # fmt: skip


USAGE_CHUNK = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "up",
               "choices": [], "usage": USAGE}  # fmt: skip


def run(call: ChatCall, chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    translator = ResponseStreamTranslator(call, "resp_s", created_at=1_700_000_000)
    events = translator.start()
    for item in chunks:
        events += translator.feed(item)
    return events + translator.finish()


def check(events: list[dict[str, Any]]) -> list[Any]:
    parsed = [EVENTS.validate_python(event) for event in events]
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    return parsed


def test_text_stream_events() -> None:
    call = parse_responses(body(stream=True), LIMIT)
    events = run(call, [chunk({"role": "assistant", "content": ""}), chunk({"content": "Hel"}),
                        chunk({"content": "lo"}), chunk({}, "stop"), USAGE_CHUNK])  # fmt: skip
    parsed = check(events)
    assert [event.type for event in parsed] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.delta for e in parsed if e.type == "response.output_text.delta"] == ["Hel", "lo"]
    assert parsed[6].text == "Hello"
    final = parsed[-1].response
    assert final.status == "completed" and final.output_text == "Hello"
    assert final.usage is not None and final.usage.total_tokens == 18
    assert parsed[0].response.status == "in_progress" and parsed[0].response.output == []


def test_tool_call_stream_events() -> None:
    call = parse_responses(body(stream=True, tools=[FN]), LIMIT)
    events = run(
        call,
        [
            chunk({"content": "Checking."}),
            chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                   "function": {"name": "get_weather", "arguments": ""}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
            chunk({"tool_calls": [{"index": 1, "id": "call_2", "type": "function",
                                   "function": {"name": "get_weather", "arguments": "{}"}}]}),
            chunk({}, "tool_calls"),
            USAGE_CHUNK,
        ],
    )  # fmt: skip
    parsed = check(events)
    kinds = [event.type for event in parsed]
    assert kinds.count("response.output_item.added") == 3
    assert kinds.count("response.output_item.done") == 3
    done = [e for e in parsed if e.type == "response.function_call_arguments.done"]
    assert [e.arguments for e in done] == ['{"city":"Paris"}', "{}"]
    assert [e.output_index for e in done] == [1, 2]
    final = parsed[-1].response
    assert parsed[-1].type == "response.completed"
    assert [item.type for item in final.output] == ["message", "function_call", "function_call"]
    assert final.output[1].call_id == "call_1" and final.output[1].status == "completed"


def test_length_stream_ends_incomplete() -> None:
    call = parse_responses(body(stream=True, max_output_tokens=2), LIMIT)
    parsed = check(run(call, [chunk({"content": "Once upon"}, "length"), USAGE_CHUNK]))
    assert parsed[-1].type == "response.incomplete"
    assert parsed[-1].response.incomplete_details.reason == "max_output_tokens"


def test_failed_event_carries_the_gateway_code() -> None:
    call = parse_responses(body(stream=True), LIMIT)
    translator = ResponseStreamTranslator(call, "resp_f", created_at=1)
    events = translator.start() + translator.feed(chunk({"content": "partial"}))
    failed = translator.failed("request_timeout", "The call ran out of time.")
    assert failed["sequence_number"] == len(events)
    assert failed["response"]["error"] == {
        "code": "request_timeout", "message": "The call ran out of time."}  # fmt: skip
    # The client parses events loosely (construct): our code survives as is.
    loose = construct_type(type_=ResponseStreamEvent, value=failed)
    assert loose.type == "response.failed"
    assert loose.response.error.code == "request_timeout"
    assert loose.response.status == "failed"
    # Strictly, the shape is right; only OpenAI's own code list differs from the spec's codes.
    error = {"code": "server_error", "message": "x"}
    strict = {**failed, "response": {**failed["response"], "error": error}}
    assert EVENTS.validate_python(strict).response.status == "failed"


def test_translator_default_created_at() -> None:
    translator = ResponseStreamTranslator(parse_responses(body(), LIMIT), "resp_d")
    assert translator.start()[0]["response"]["created_at"] > 1_700_000_000


def sdk_final(events: list[dict[str, Any]]) -> Any:
    """The events through the official client's own stream accumulator (what
    ``client.responses.stream()`` does): it raises on any inconsistency of ids, indexes
    and items, and returns the response it assembled."""
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=omit, text_format=omit)
    for event in check(events):
        state.handle_event(event)
    return state._completed_response


def tool_piece(index: int, **fields: Any) -> dict[str, Any]:
    call: dict[str, Any] = {"index": index}
    if "id" in fields:
        call.update(id=fields["id"], type="function")
    call["function"] = {k: v for k, v in fields.items() if k in ("name", "arguments")}
    return chunk({"tool_calls": [call]})


def test_interleaved_parallel_tool_calls_keep_one_item_each() -> None:
    call = parse_responses(body(stream=True, tools=[FN]), LIMIT)
    events = run(
        call,
        [
            tool_piece(0, id="call_a", name="get_weather", arguments=""),
            tool_piece(1, id="call_b", name="get_time", arguments=""),
            tool_piece(0, arguments='{"ci'),
            tool_piece(1, arguments='{"tz"'),
            tool_piece(0, arguments='ty": "Paris"}'),
            tool_piece(1, arguments=': "UTC"}'),
            chunk({}, "tool_calls"),
            USAGE_CHUNK,
        ],
    )
    final = sdk_final(events)
    calls = [(i.call_id, i.name, i.arguments, i.status) for i in final.output]
    assert calls == [
        ("call_a", "get_weather", '{"city": "Paris"}', "completed"),
        ("call_b", "get_time", '{"tz": "UTC"}', "completed"),
    ]
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert [e["output_index"] for e in added] == [0, 1]
    deltas = [e for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert [e["output_index"] for e in deltas] == [0, 1, 0, 1]


def test_text_after_a_tool_call_is_a_new_message_item() -> None:
    call = parse_responses(body(stream=True, tools=[FN]), LIMIT)
    events = run(
        call,
        [
            chunk({"content": "First."}),
            tool_piece(0, id="call_a", name="get_weather", arguments='{"city": "Paris"}'),
            chunk({"content": "Second."}),
            chunk({}, "stop"),
        ],
    )
    final = sdk_final(events)
    assert [item.type for item in final.output] == ["message", "function_call", "message"]
    assert final.output[0].id != final.output[2].id
    assert final.output[0].id == "msg_s"  # the first message: the id a whole answer gets
    added = next(e for e in events if e["type"] == "response.output_item.added"
                 and e["item"]["type"] == "function_call")  # fmt: skip
    assert added["item"]["arguments"] == "", "the arguments come in their delta, once"


def test_a_streamed_refusal_is_a_refusal_part() -> None:
    call = parse_responses(body(stream=True), LIMIT)
    events = run(call, [chunk({"refusal": "I can't "}), chunk({"refusal": "help."}),
                        chunk({}, "stop")])  # fmt: skip
    kinds = [event["type"] for event in events]
    assert kinds.count("response.refusal.delta") == 2 and "response.refusal.done" in kinds
    final = sdk_final(events)
    parts = final.output[0].content
    assert [(p.type, p.refusal) for p in parts] == [("refusal", "I can't help.")]


def test_items_of_an_incomplete_response_are_incomplete() -> None:
    call = parse_responses(body(stream=True, tools=[FN]), LIMIT)
    cut = [tool_piece(0, id="call_a", name="get_weather", arguments='{"city": "Pa'),
           chunk({}, "length")]  # fmt: skip
    events = run(call, cut)
    assert events[-1]["type"] == "response.incomplete"
    assert [item["status"] for item in events[-1]["response"]["output"]] == ["incomplete"]
    tool_call = {"id": "call_a", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Pa'}}  # fmt: skip
    whole = completion({"content": None, "tool_calls": [tool_call]}, "length")
    answer = chat_to_response(whole, parse_responses(body(tools=[FN]), LIMIT), "resp_i")
    assert [item["status"] for item in answer["output"]] == ["incomplete"]


def test_a_refusal_sent_back_as_input_is_read() -> None:
    earlier = {"type": "message", "role": "assistant",
               "content": [{"type": "refusal", "refusal": "No."}]}  # fmt: skip
    call = parse_responses(body(input=[message("q"), earlier, message("ok")]), LIMIT)
    assert call.messages[1] == {"role": "assistant", "content": [{"type": "text", "text": "No."}]}
