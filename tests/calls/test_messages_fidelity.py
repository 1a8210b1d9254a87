"""Messages without translation loss (issue 47), through the official ``anthropic`` SDK
on the sandbox mock (a translated deployment): structured output, stop sequences, input
tokens in ``message_start``, and ``models.list()`` in Anthropic's shape."""

from __future__ import annotations

import anthropic
import httpx
import orjson
import pydantic
import pytest

from gateway.calls.parse.anthropic_messages import parse_messages
from gateway.calls.parse.messages_answer import MessageStreamTranslator, chat_to_message
from gateway.errors import GatewayError
from gateway.providers.anthropic_translate import StreamTranslator, completion
from gateway.providers.bedrock.converse import converse_request
from gateway.providers.gemini.gemini_request import generate_request
from tests.calls.test_messages import HELLO, MODEL, refused, run
from tests.conftest import Gateway


class Weather(pydantic.BaseModel):
    city: str
    degrees: int
    sunny: bool


async def test_messages_parse_returns_a_parsed_object(gateway: Gateway) -> None:
    token = (await gateway.create_key())["token"]
    message = await run(
        gateway,
        token,
        lambda c: c.messages.parse(
            model=MODEL, max_tokens=256, messages=HELLO, output_format=Weather
        ),
    )
    assert isinstance(message.parsed_output, Weather)
    assert message.stop_reason == "end_turn"


async def test_structured_output_on_a_model_without_it_is_refused(gateway: Gateway) -> None:
    token = (await gateway.create_key())["token"]
    error = await refused(
        gateway,
        token,
        lambda c: c.messages.parse(
            model="mock-basic", max_tokens=64, messages=HELLO, output_format=Weather
        ),
    )
    assert error.status_code == 400
    body = error.response.json()["error"]
    assert body["type"] == "invalid_request_error"
    assert body["code"] == "model_lacks_structured_output"
    assert body["param"] == "output_config"
    assert error.response.json()["type"] == "error"


async def test_a_stop_sequence_is_named_whole_and_streamed(gateway: Gateway) -> None:
    """The mock's prose says "This is a deterministic mock reply": cut at "mock"."""
    token = (await gateway.create_key())["token"]
    stops = ["never-in-the-text", "mock"]
    message = await run(
        gateway,
        token,
        lambda c: c.messages.create(
            model=MODEL, max_tokens=64, messages=HELLO, stop_sequences=stops
        ),
    )
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "mock")
    assert message.content[0].text == "This is a deterministic "

    def streamed(client: anthropic.Anthropic) -> anthropic.types.Message:
        with client.messages.stream(
            model=MODEL, max_tokens=64, messages=HELLO, stop_sequences=stops
        ) as stream:
            return stream.get_final_message()

    final = await run(gateway, token, streamed)
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "mock")
    plain = await run(
        gateway, token, lambda c: c.messages.create(model=MODEL, max_tokens=64, messages=HELLO)
    )
    assert (plain.stop_reason, plain.stop_sequence) == ("end_turn", None)


async def test_message_start_carries_the_input_tokens(gateway: Gateway) -> None:
    token = (await gateway.create_key())["token"]
    body = {"model": MODEL, "max_tokens": 32, "messages": HELLO, "stream": True}
    async with gateway.client(token) as client:
        response = await client.post("/v1/messages", json=body)
    events = [
        orjson.loads(line.removeprefix("data: "))
        for line in response.text.splitlines()
        if line.startswith("data: ")
    ]
    start, delta = events[0], next(e for e in events if e["type"] == "message_delta")
    assert start["type"] == "message_start"
    # the reservation's bound of the prompt, never below the count that follows
    assert start["message"]["usage"]["input_tokens"] >= delta["usage"]["input_tokens"] > 0


async def test_models_list_speaks_anthropic_to_anthropic_clients(gateway: Gateway) -> None:
    token = (await gateway.create_key())["token"]
    page = await run(gateway, token, lambda c: c.models.list())
    ids = [model.id for model in page.data]
    assert MODEL in ids and "text-embedding-3-small" not in ids
    for model in page.data:
        assert model.type == "model" and model.display_name and model.created_at.year >= 2023
    assert (page.first_id, page.last_id, page.has_more) == (ids[0], ids[-1], False)
    one = await run(gateway, token, lambda c: c.models.retrieve(MODEL))
    assert one.type == "model" and one.id == MODEL
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        openai_shape = (await client.get("/v1/models")).json()
        keyless = await client.get("/v1/models", headers={"anthropic-version": "2023-06-01"})
    assert openai_shape["object"] == "list" and "text-embedding-3-small" in str(openai_shape)
    assert keyless.json()["data"][0]["type"] == "model"
    assert keyless.headers["vary"] == "anthropic-version"


SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "degrees": {"type": "integer"}},
    "required": ["city", "degrees"],
    "additionalProperties": False,
}


def test_output_config_maps_to_each_kinds_structured_output() -> None:
    """One Messages body: chat's response_format (openai, azure, the mock), Gemini's
    responseSchema, Bedrock's forced answer tool; passed through unchanged to an
    ``anthropic`` deployment (the native body), ``effort`` named as ignored."""
    output_config = {"format": {"type": "json_schema", "schema": SCHEMA}, "effort": "low"}
    body = {"model": MODEL, "max_tokens": 64, "messages": HELLO, "output_config": output_config}
    call = parse_messages(body, 4096)
    chat = call.body()
    assert chat["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "output", "schema": SCHEMA}
    }  # fmt: skip
    assert "structured_output" in call.needs and "output_config.effort" in call.dropped
    assert call.native is not None and call.native.body["output_config"] == output_config
    config = generate_request(chat)["generationConfig"]
    assert config["responseMimeType"] == "application/json"
    assert set(config["responseSchema"]["properties"]) == {"city", "degrees"}
    converse = converse_request(chat)
    tool = converse.body["toolConfig"]["tools"][-1]["toolSpec"]
    assert tool["inputSchema"] == {"json": SCHEMA}
    assert converse.body["toolConfig"]["toolChoice"] == {"tool": {"name": tool["name"]}}
    assert converse.answer_tool == tool["name"]
    legacy = parse_messages({**body, "output_config": None,
                             "output_format": output_config["format"]}, 4096)  # fmt: skip
    assert legacy.body()["response_format"] == chat["response_format"]


def test_an_output_format_that_is_not_a_json_schema_is_invalid() -> None:
    body = {"model": MODEL, "max_tokens": 64, "messages": HELLO,
            "output_config": {"format": {"type": "text"}}}  # fmt: skip
    with pytest.raises(GatewayError) as caught:
        parse_messages(body, 4096)
    assert caught.value.param == "output_config"


def test_an_anthropic_upstreams_stop_sequence_survives_two_translations() -> None:
    """Anthropic → chat (the ``anthropic`` kind behind chat shapes) → Messages (a
    Messages call translated): the sequence rides in the choice's ``stop_reason``,
    whole and streamed; an OpenAI-style "stop" without it stays end_turn."""
    call = parse_messages(
        {"model": MODEL, "max_tokens": 64, "messages": HELLO, "stop_sequences": ["END"]}, 4096
    )
    upstream = {"id": "msg_1", "model": "claude", "content": [{"type": "text", "text": "a"}],
                "stop_reason": "stop_sequence", "stop_sequence": "END",
                "usage": {"input_tokens": 3, "output_tokens": 1}}  # fmt: skip
    chat = completion(upstream, "claude", structured=False)
    message = chat_to_message(chat, call, "msg_x")
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", "END")
    translator, relay = StreamTranslator("claude", False), MessageStreamTranslator(call, "m", None)
    delta = {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    for chunk in translator.feed({"type": "message_delta", "delta": delta, "usage": {}}):
        relay.feed(chunk)
    ending = relay.finish()[-2]["delta"]
    assert ending == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    del chat["choices"][0]["stop_reason"]
    assert chat_to_message(chat, call, "msg_x")["stop_sequence"] is None
