"""Messages without translation loss (issue 47), through the official ``anthropic`` SDK
on the sandbox mock (a translated deployment): structured output, stop sequences, input
tokens in ``message_start``, and ``models.list()`` in Anthropic's shape."""

from __future__ import annotations

import anthropic
import httpx
import orjson
import pydantic

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
