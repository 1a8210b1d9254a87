"""What the official ``openai`` client expects of the gateway (issue 16), through that client.

The client runs in a worker thread against a real server on a loopback port, with its
default ``max_retries`` (2) wherever retries are the point. How many requests reached
the server is read from the key's request window in its shard (the counter behind
``GET /v1/key``), which counts refused requests too and never counts the read itself.
The gateway's FakeClock stands still, so every request lands in one minute window.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import openai
import pytest
import trio
from openai import omit

from gateway.accounts.key_record import key_ref
from gateway.config.settings import ModelConfig
from shards import FakeClock
from tests.conftest import Gateway, make_config, start_gateway

T = TypeVar("T")
HELLO = [{"role": "user", "content": "Say hello."}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
SDK = Callable[..., openai.OpenAI]


@pytest.fixture
def sdk() -> Iterator[SDK]:
    """Makes clients of a gateway (closed after the test, so no socket is left open)."""
    made: list[openai.OpenAI] = []

    def client(gw: Gateway, token: str, **options: Any) -> openai.OpenAI:
        made.append(openai.OpenAI(base_url=f"{gw.url}/v1", api_key=token, timeout=10.0, **options))
        return made[-1]

    yield client
    for client_made in made:
        client_made.close()


async def in_thread(call: Callable[[], T], seconds: float = 20) -> T:
    with trio.fail_after(seconds):
        return await trio.to_thread.run_sync(call)


async def refusal(call: Callable[[], Any], seconds: float = 20) -> openai.APIStatusError:
    """The client's exception of a call that must fail."""

    def run() -> openai.APIStatusError:
        try:
            call()
        except openai.APIStatusError as exc:
            return exc
        raise AssertionError("expected an error answer")

    return await in_thread(run, seconds)


async def requests_seen(gw: Gateway, key_id: str) -> int:
    """Requests of this key the server counted in the current minute."""
    record = gw.runtime.keyring.get(key_id)
    assert record is not None
    status = await gw.runtime.pool.key_status(
        key_ref(record),
        rpm=record.caps.rpm,
        tpm=record.caps.tpm,
        max_in_flight=record.caps.max_in_flight,
        usd_day=None,
        usd_month=None,
    )
    return status.requests_this_minute


# ---------------------------------------------------------------- models.retrieve


async def test_retrieve_answers_the_model_object_of_the_list(gateway: Gateway, sdk: SDK) -> None:
    client = sdk(gateway, gateway.token)
    listed, model = await in_thread(
        lambda: (
            {m.id: m for m in client.models.list()},
            client.models.retrieve("gpt-4o-mini"),
        )
    )
    assert model.id == "gpt-4o-mini" and model.object == "model"
    assert model.model_dump() == listed["gpt-4o-mini"].model_dump()


async def test_retrieve_of_an_unknown_model_is_model_not_found(gateway: Gateway, sdk: SDK) -> None:
    client = sdk(gateway, gateway.token)
    error = await refusal(lambda: client.models.retrieve("gpt-9"))
    assert isinstance(error, openai.NotFoundError)
    assert (error.code, error.param) == ("model_not_found", "model")
    body = error.response.json()
    assert body["svc"] == {
        "request_id": error.response.headers["X-Request-Id"],
        "policy": {"decisions": [{"rule": "unknown_model", "verdict": "deny"}]},
    }
    assert error.response.headers["x-should-retry"] == "false"


async def test_retrieve_without_a_key_is_the_public_catalog(gateway: Gateway, sdk: SDK) -> None:
    client = sdk(gateway, "unused")
    no_key = {"Authorization": omit}
    raw = await in_thread(
        lambda: client.models.with_raw_response.retrieve("gpt-4o", extra_headers=no_key)
    )
    assert raw.parse().id == "gpt-4o"
    assert raw.headers["X-RateLimit-Remaining"] == "59"  # the per-IP window
    missing = await refusal(lambda: client.models.retrieve("gpt-9", extra_headers=no_key))
    assert missing.status_code == 404 and missing.code == "model_not_found"
    assert missing.response.headers["X-RateLimit-Remaining"] == "58"


async def test_retrieve_with_an_embeddings_only_key_is_scope_denied(
    gateway: Gateway, sdk: SDK
) -> None:
    key = await gateway.create_key(name="embed-only", scopes=["embeddings"])
    client = sdk(gateway, key["token"])
    error = await refusal(lambda: client.models.retrieve("text-embedding-3-small"))
    assert isinstance(error, openai.PermissionDeniedError)
    assert error.code == "scope_denied"


async def test_retrieve_follows_the_organisation_rules(gateway: Gateway, sdk: SDK) -> None:
    """A model the organisation's policy denies is invisible: 404, as it is absent from
    the list, while the public catalog still shows it."""
    policy = {"contract_blocked_models": ["gpt-4o"]}
    assert (await gateway.admin("PUT", f"/admin/orgs/{gateway.org_id}/policy", policy)).is_success
    client = sdk(gateway, gateway.token)
    assert "gpt-4o" not in await in_thread(lambda: [m.id for m in client.models.list()])
    error = await refusal(lambda: client.models.retrieve("gpt-4o"))
    assert error.status_code == 404 and error.code == "model_not_found"


async def test_a_model_id_may_hold_a_slash(nursery: trio.Nursery, tmp_path: Path, sdk: SDK) -> None:
    config = make_config(tmp_path)
    llama = ModelConfig("meta/llama-x", "mock", "llama-x", input_usd_per_mtok=0.1,
                        output_usd_per_mtok=0.1, aliases=("llama",))  # fmt: skip
    gw = await start_gateway(nursery, replace(config, models=(*config.models, llama)))
    client = sdk(gw, gw.token)
    assert (await in_thread(lambda: client.models.retrieve("meta/llama-x"))).id == "meta/llama-x"
    assert (await in_thread(lambda: client.models.retrieve("llama"))).id == "meta/llama-x"
    async with gw.client(gw.token) as http:
        assert (await http.get("/v1/models/meta/llama-x")).json()["id"] == "meta/llama-x"
        wrong = await http.post("/v1/models/meta/llama-x")
        assert (wrong.status_code, wrong.json()["error"]["code"]) == (405, "method_not_allowed")
    gw.stop.set()


# ---------------------------------------------------------------- retries


async def test_a_501_reaches_the_server_once(clocked_gateway: Gateway, sdk: SDK) -> None:
    gw = clocked_gateway
    key = await gw.create_key(data_mode="confidential")
    client = sdk(gw, key["token"])  # the client's default max_retries
    error = await refusal(
        lambda: client.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    )
    assert (error.status_code, error.code) == (501, "not_implemented")
    assert error.response.headers["x-should-retry"] == "false"
    assert await requests_seen(gw, key["id"]) == 1


async def test_a_conflict_that_cannot_resolve_reaches_the_server_once(
    clocked_gateway: Gateway, sdk: SDK
) -> None:
    """A repeat of a streamed call's Idempotency-Key is 409 idempotency_conflict (its
    answer was not stored): the client must not try it three times."""
    gw = clocked_gateway
    key = await gw.create_key()
    client = sdk(gw, key["token"])
    headers = {"Idempotency-Key": "streamed-1"}

    def streamed() -> None:
        stream = client.chat.completions.create(
            model="gpt-4o-mini", messages=HELLO, stream=True, extra_headers=headers
        )
        for _ in stream:
            pass

    await in_thread(streamed)
    error = await refusal(streamed)
    assert (error.status_code, error.code) == (409, "idempotency_conflict")
    assert error.response.headers["x-should-retry"] == "false"
    assert await requests_seen(gw, key["id"]) == 2


async def test_a_429_is_retried(clocked_gateway: Gateway, clock: FakeClock, sdk: SDK) -> None:
    """rpm 1 at hh:mm:59: the second call is 429 with Retry-After 1, tried three times."""
    gw = clocked_gateway
    clock.advance(29)
    key = await gw.create_key(caps={"rpm": 1})
    client = sdk(gw, key["token"])
    await in_thread(lambda: client.chat.completions.create(model="gpt-4o-mini", messages=HELLO))
    error = await refusal(
        lambda: client.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    )
    assert (error.status_code, error.code) == (429, "rate_limited")
    assert error.response.headers["x-should-retry"] == "true"
    assert error.response.headers["Retry-After"] == "1"
    assert await requests_seen(gw, key["id"]) == 1 + 3


# ---------------------------------------------------------------- sandbox answers


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_identical_sandbox_calls_get_distinct_ids(
    clocked_gateway: Gateway, clock: FakeClock, stream: bool, sdk: SDK
) -> None:
    client = sdk(clocked_gateway, clocked_gateway.token, max_retries=0)

    def chat() -> tuple[str, int, str]:
        if stream:
            chunks = list(
                client.chat.completions.create(model="gpt-4o-mini", messages=HELLO, stream=True)
            )
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert len({c.id for c in chunks}) == 1
            return chunks[0].id, chunks[0].created, text
        answer = client.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
        return answer.id, answer.created, answer.choices[0].message.content or ""

    def responses() -> tuple[str, float, str]:
        if stream:
            with client.responses.stream(model="gpt-4o-mini", input="Say hello.") as events:
                answer = events.get_final_response()
        else:
            answer = client.responses.create(model="gpt-4o-mini", input="Say hello.")
        return answer.id, answer.created_at, answer.output_text

    for call in (chat, responses):
        (first_id, first_at, first_text), (second_id, second_at, second_text) = [
            await in_thread(call) for _ in range(2)
        ]
        assert first_id != second_id
        assert first_text == second_text and first_text  # the content stays deterministic
        assert first_at == second_at
    # chat answers are dated by the server's (injectable) clock
    assert (await in_thread(chat))[1] == int(clock.now())


# ---------------------------------------------------------------- refusals and nulls


async def test_a_forcing_tool_choice_says_what_works_instead(gateway: Gateway, sdk: SDK) -> None:
    client = sdk(gateway, gateway.token)
    chat = await refusal(
        lambda: client.chat.completions.create(
            model="gpt-4o-mini", messages=HELLO, tools=[TOOL], tool_choice="required"
        )
    )
    responses = await refusal(
        lambda: client.responses.create(
            model="gpt-4o-mini",
            input="hi",
            tools=[{"type": "function", "name": "f", "parameters": {"type": "object"}}],
            tool_choice="required",
        )
    )
    for error, alternative in ((chat, "response_format"), (responses, "text.format")):
        assert (error.status_code, error.code, error.param) == (
            400,
            "unsupported_parameter",
            "tool_choice",
        )
        assert f"{alternative} with type json_schema" in error.message
        assert "tool_choice auto" in error.message


async def test_an_unknown_parameter_is_not_supported_by_this_gateway(
    gateway: Gateway, sdk: SDK
) -> None:
    client = sdk(gateway, gateway.token)
    error = await refusal(
        lambda: client.chat.completions.create(
            model="gpt-4o-mini", messages=HELLO, presence_penalty=0.5
        )
    )
    assert (error.code, error.param) == ("unsupported_parameter", "presence_penalty")
    assert "not supported by this gateway" in error.message
    assert "nknown" not in error.message


CHAT_NULLS = dict.fromkeys(
    ("temperature", "top_p", "n", "stop", "max_tokens", "max_completion_tokens",
     "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs",
     "user", "seed", "tools", "tool_choice", "response_format", "stream_options",
     "parallel_tool_calls", "prediction", "audio", "modalities", "functions",
     "function_call", "service_tier", "store", "metadata", "reasoning_effort",
     "web_search_options")
)  # fmt: skip
RESPONSES_NULLS = dict.fromkeys(
    ("instructions", "max_output_tokens", "temperature", "top_p", "tools", "tool_choice",
     "parallel_tool_calls", "user", "service_tier", "metadata", "store", "background",
     "truncation", "include", "previous_response_id", "top_logprobs", "reasoning", "text")
)  # fmt: skip


async def test_a_body_full_of_null_optional_fields_is_served(gateway: Gateway, sdk: SDK) -> None:
    """As sent by wrappers that pass None for every argument left out."""
    client = sdk(gateway, gateway.token, max_retries=0)
    chat = await in_thread(
        lambda: client.chat.completions.create(
            model="gpt-4o-mini", messages=HELLO, **CHAT_NULLS, extra_body={"svc_tags": None}
        )
    )
    assert chat.choices[0].message.content
    answer = await in_thread(
        lambda: client.responses.create(
            model="gpt-4o-mini",
            input="Say hello.",
            **RESPONSES_NULLS,
            extra_body={"stream_options": None, "connectors": None},
        )
    )
    assert answer.output_text
