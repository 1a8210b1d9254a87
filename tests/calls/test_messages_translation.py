"""The Messages translation, without a server: Anthropic's request → a chat call, a chat
completion and its chunks → Anthropic's message and events (validated by the official
``anthropic`` SDK's types and its stream accumulator), errors in Anthropic's dialect."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from gateway.calls.estimate import estimate_prompt_tokens
from gateway.calls.parse.anthropic_messages import parse_messages
from gateway.calls.parse.messages_answer import MessageStreamTranslator, chat_to_message
from gateway.calls.streaming import MessagesFormat
from gateway.errors import GatewayError

LIMIT = 4096
EVENTS: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}],
            **fields}  # fmt: skip


def refused(payload: Any) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        parse_messages(payload, LIMIT)
    return caught.value


@pytest.mark.parametrize(
    ("payload", "code", "param"),
    [
        ({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, "invalid_request",
         "max_tokens"),
        (body(model=None), "invalid_request", "model"),
        (body(max_tokens=LIMIT + 1), "max_tokens_exceeds_key_limit", "max_tokens"),
        (body(container="c"), "unsupported_parameter", "container"),
        (body(mcp_servers=[{"type": "url", "url": "https://x"}]), "unsupported_parameter",
         "mcp_servers"),
        (body(tools=[{"type": "bash_20250124", "name": "bash"}]), "unsupported_parameter",
         "tools"),
        (body(messages=[]), "invalid_messages", "messages"),
        (body(messages=[{"role": "tool", "content": "x"}]), "invalid_messages", "messages"),
        (body(messages=[{"role": "user", "content": [{"type": "document"}]}]),
         "unsupported_parameter", "messages"),
        (body(temperature=1.5), "invalid_request", "temperature"),
        (body(stop_sequences="x"), "invalid_request", "stop_sequences"),
    ],
)  # fmt: skip
def test_refusals_name_the_field(payload: Any, code: str, param: str) -> None:
    error = refused(payload)
    assert (error.code, error.param) == (code, param)


def test_a_forcing_tool_choice_with_tools_is_refused_and_says_what_works() -> None:
    tools = [{"name": "f", "input_schema": {"type": "object"}}]
    error = refused(body(tools=tools, tool_choice={"type": "tool", "name": "f"}))
    assert error.code == "unsupported_parameter" and "tool_choice auto" in (error.message or "")


def test_the_budget_refusal_says_how_to_fix_the_setup() -> None:
    message = refused(body(max_tokens=128000)).message or ""
    assert "CLAUDE_CODE_MAX_OUTPUT_TOKENS=4096" in message and "max_output_tokens" in message


def test_a_claude_code_shaped_request_translates() -> None:
    call = parse_messages(
        {
            "model": "m",
            "max_tokens": 4000,
            "system": [{"type": "text", "text": "A"},
                       {"type": "text", "text": "B", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "one"},
                                             {"type": "text", "text": "two"}]},
                {"role": "system", "content": [{"type": "text", "text": "mid"}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "...", "signature": "s"},
                    {"type": "text", "text": "calling"},
                    {"type": "tool_use", "id": "tu_1", "name": "f", "input": {"a": 1}}]},
                {"role": "user", "content": [
                    {"type": "text", "text": "after"},
                    {"type": "tool_result", "tool_use_id": "tu_1",
                     "content": [{"type": "text", "text": "42"}], "is_error": True}]},
            ],
            "tools": [{"name": "f", "input_schema": {"type": "object"}, "defer_loading": True},
                      {"type": "web_search_20250305", "name": "web_search"}],
            "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
            "metadata": {"user_id": '{"device_id": "d"}'},
            "thinking": {"type": "adaptive"},
            "context_management": {"edits": []},
            "output_config": {"effort": "medium"},
            "stop_sequences": ["END"],
            "top_k": 3,
            "stream": True,
        },
        LIMIT,
    )  # fmt: skip
    assert call.messages == [
        {"role": "system", "content": "A\n\nB"},
        {"role": "user", "content": "one\n\ntwo"},
        {"role": "system", "content": "mid"},
        {"role": "assistant", "content": "calling", "tool_calls": [
            {"id": "tu_1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}]},
        {"role": "tool", "tool_call_id": "tu_1", "content": "Error: 42"},
        {"role": "user", "content": "after"},
    ]  # fmt: skip
    assert call.params["stop"] == ["END"] and call.params["parallel_tool_calls"] is False
    assert call.params["tools"] == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]
    assert call.params["web_search_options"] == {} and "web_search" in call.needs
    assert call.stream and call.max_tokens == 4000 and call.endpoint == "messages"
    assert set(call.dropped) == {
        "context_management", "output_config.effort", "top_k", "thinking", "cache_control",
        "defer_loading",
    }  # fmt: skip


COMPLETION = {
    "id": "chatcmpl-1",
    "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "Let me look.",
        "tool_calls": [{"id": "call_1", "type": "function",
                        "function": {"name": "f", "arguments": '{"city": "Paris"}'}}]}}],
    "usage": {"prompt_tokens": 30, "completion_tokens": 7, "total_tokens": 37,
              "prompt_tokens_details": {"cached_tokens": 10, "cache_write_tokens": 5}},
}  # fmt: skip


def test_a_completion_becomes_a_message_the_sdk_reads() -> None:
    call = parse_messages(body(), LIMIT)
    message = Message.model_validate(chat_to_message(COMPLETION, call, "msg_1"))
    assert message.stop_reason == "tool_use"
    assert [block.type for block in message.content] == ["text", "tool_use"]
    assert message.content[1].input == {"city": "Paris"}  # type: ignore[union-attr]  # a tool_use block
    usage = message.usage
    assert (usage.input_tokens, usage.cache_read_input_tokens,
            usage.cache_creation_input_tokens, usage.output_tokens) == (15, 10, 5, 7)  # fmt: skip


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def test_a_stream_becomes_anthropics_events_and_accumulates() -> None:
    from anthropic.lib.streaming._messages import accumulate_event

    call = parse_messages(body(stream=True), LIMIT)
    fmt = MessagesFormat(MessageStreamTranslator(call, "msg_1", {"request_id": "req_1"}))
    frames = fmt.chunk(chunk({"role": "assistant", "content": "He"}))
    frames += fmt.chunk(chunk({"content": "llo"}))
    frames += fmt.chunk(
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "f", "arguments": '{"a"'},
                    }
                ]
            }
        )
    )
    frames += fmt.chunk(chunk({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}))
    frames += fmt.chunk(chunk({}, "tool_calls"))
    fmt.usage({"choices": [], "usage": COMPLETION["usage"]})
    frames += fmt.finish()
    events = []
    for frame in frames:
        head, data = frame.decode().split("\n", 1)
        event = orjson.loads(data.removeprefix("data: "))
        assert head == f"event: {event['type']}"
        events.append(EVENTS.validate_python(event))
    assert [event.type for event in events] == [
        "message_start", "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_stop", "content_block_start", "content_block_delta",
        "content_block_delta", "content_block_stop", "message_delta", "message_stop",
    ]  # fmt: skip
    snapshot = None
    buffers: dict[int, bytes] = {}
    for event in events:
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=buffers)
    assert snapshot is not None
    assert snapshot.content[0].text == "Hello"  # type: ignore[union-attr]  # a text block
    assert snapshot.content[1].input == {"a": 1}  # type: ignore[union-attr]  # a tool_use block
    assert snapshot.stop_reason == "tool_use" and snapshot.usage.cache_read_input_tokens == 10
    assert fmt.keepalive == b'event: ping\ndata: {"type":"ping"}\n\n'


def test_a_failure_in_a_stream_is_an_error_event_in_anthropics_dialect() -> None:
    call = parse_messages(body(stream=True), LIMIT)
    fmt = MessagesFormat(MessageStreamTranslator(call, "msg_1", None))
    fmt.chunk(chunk({"content": "x"}))
    (frame,) = fmt.error(GatewayError("request_timeout", "The call reached its time limit."))
    head, data = frame.decode().split("\n", 1)
    assert head == "event: error"
    assert orjson.loads(data.removeprefix("data: ")) == {
        "type": "error",
        "error": {"type": "timeout_error", "message": "The call reached its time limit.",
                  "code": "request_timeout", "param": None},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("code", "kind"),
    [("key_cap_exceeded", "billing_error"), ("request_timeout", "timeout_error"),
     ("service_unavailable", "overloaded_error"), ("pricing_unavailable", "api_error"),
     ("request_too_large", "request_too_large"), ("invalid_api_key", "authentication_error"),
     ("scope_denied", "permission_error"), ("model_not_found", "not_found_error"),
     ("rate_limited", "rate_limit_error"), ("internal_error", "api_error"),
     ("unsupported_parameter", "invalid_request_error")],
)  # fmt: skip
def test_the_anthropic_error_types_by_status(code: str, kind: str) -> None:
    assert GatewayError(code).anthropic_body()["error"]["type"] == kind


def test_thinking_blocks_passed_through_count_in_the_estimate() -> None:
    """Earlier turns' thinking blocks are dropped by the translation but passed through
    to an anthropic deployment (which counts them as input in a tool-use loop): the one
    reservation bounds both."""
    thought = {"type": "thinking", "thinking": "let me see " * 50, "signature": "c2ln" * 20}
    body = {"model": "m", "max_tokens": 16, "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [thought, {"type": "text", "text": "sunny"}]},
        {"role": "user", "content": "thanks"},
    ]}  # fmt: skip
    call = parse_messages(body, 4096)
    assert call.native is not None and call.native.body["messages"][1]["content"][0] == thought
    assert "thinking" in call.dropped
    unsent = len(orjson.dumps(thought))
    assert call.prompt_estimate() == estimate_prompt_tokens(call.body()) + unsent
