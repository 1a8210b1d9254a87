"""/v1/messages passed through to an ``anthropic`` deployment, and translated for an
``openai`` one, on one gateway: the fake Messages API (gateway/fakes/fake_anthropic.py,
which refuses what the real API refuses, beta fields included unless their beta is
sent) and the fake OpenAI upstream, both real servers that record what they received.

The request of :func:`claude_code_body` is shaped as Claude Code 2.1.332 sends it (issue
36): ``?beta=true``, eight betas, ``x-app``, system blocks with ``cache_control``, 12 tools
of which one has ``defer_loading``, ``metadata.user_id`` a JSON string, ``max_tokens``
128000, adaptive thinking, ``context_management``, ``output_config``, a stream, and a
``system`` message inside ``messages``.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import anthropic
import orjson
import pytest
import trio

from gateway.calls import counting
from gateway.calls.parse.anthropic_messages import parse_messages
from gateway.config.settings import Config, ModelConfig, ProviderConfig
from gateway.fakes.fake_anthropic import FakeAnthropic
from gateway.fakes.fake_upstream import FakeUpstream
from tests.calls.test_live_settlement import settled, state
from tests.conftest import Gateway, make_config, start_gateway

OUR_KEY = "sk-ant-gateway-own-key-0123456789"
UPSTREAM_KEY = "sk-upstream-native-0123456789"
IN, OUT, READ, WRITE = 3.0, 15.0, 0.3, 3.75
#: the betas Claude Code 2.1.332 sends
BETAS = (
    "claude-code-20250219",
    "interleaved-thinking-2025-05-14",
    "context-management-2025-06-27",
    "per-turn-control-2026-07-01",
    "mid-conversation-tool-changes-2026-07-01",
    "thinking-token-count-2026-05-13",
    "advanced-tool-use-2025-11-20",
    "effort-2025-11-24",
)
T = TypeVar("T")


def native_config(tmp_path: Path, fake: FakeAnthropic, upstream: FakeUpstream) -> Config:
    base = make_config(tmp_path)
    claude = ProviderConfig("claude", "anthropic", base_url=fake.url, api_key_env="CLAUDE_KEY")
    openai = ProviderConfig("up", "openai", base_url=upstream.url, api_key_env="UP_KEY")
    priced = {
        "capabilities": ("tools", "vision"),
        "input_usd_per_mtok": IN,
        "output_usd_per_mtok": OUT,
        "cache_read_usd_per_mtok": READ,
        "cache_write_usd_per_mtok": WRITE,
    }
    models = (
        ModelConfig("claude-live", "claude", "claude-up", aliases=("claude-opus-5-5",), **priced),
        ModelConfig("gpt-live", "up", "up-chat", **priced),
    )
    return replace(base, providers=(*base.providers, claude, openai), models=models)


@pytest.fixture
async def fake(nursery: trio.Nursery) -> AsyncIterator[FakeAnthropic]:
    fake: FakeAnthropic = await nursery.start(FakeAnthropic(keys={OUR_KEY}).serve)
    yield fake
    assert fake.rejected == [], "the fake refused a passed-through request"


@pytest.fixture
async def gw(
    nursery: trio.Nursery,
    tmp_path: Path,
    fake: FakeAnthropic,
    upstream: FakeUpstream,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Gateway]:
    monkeypatch.setenv("CLAUDE_KEY", OUR_KEY)
    monkeypatch.setenv("UP_KEY", UPSTREAM_KEY)
    gateway = await start_gateway(nursery, native_config(tmp_path, fake, upstream))
    yield gateway
    gateway.stop.set()


async def live_key(gw: Gateway, **caps: Any) -> str:
    key = await gw.create_key(mode="live", caps={"usd_day": 100, **caps})
    return str(key["token"])


async def run(gw: Gateway, token: str, work: Callable[[anthropic.Anthropic], T]) -> T:
    def call() -> T:
        with anthropic.Anthropic(
            base_url=gw.url, auth_token=token, max_retries=0, timeout=20.0
        ) as client:
            return work(client)

    with trio.fail_after(30):
        return await trio.to_thread.run_sync(call)


def events_of(text: str) -> list[dict[str, Any]]:
    """The events of a server-sent-events body, each checked against its ``event:``."""
    events = []
    for frame in text.strip().split("\n\n"):
        head, _, data = frame.partition("\n")
        event = orjson.loads(data.removeprefix("data: "))
        assert head == f"event: {event['type']}"
        events.append(event)
    return events


def cache_cost(fresh: int, read: int, write: int, output: int) -> int:
    """Nano-USD of a call at the model's prices, cache reads and writes at their own."""
    return math.ceil((fresh * IN + read * READ + write * WRITE + output * OUT) * 1000)


async def test_a_message_is_passed_through_as_sent_with_its_betas(
    gw: Gateway, fake: FakeAnthropic
) -> None:
    token = await live_key(gw)
    system = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    messages = [{"role": "user", "content": [
        {"type": "text", "text": "hello [[cache read=100 write=50]]",
         "cache_control": {"type": "ephemeral"}}]}]  # fmt: skip

    def create(client: anthropic.Anthropic) -> Any:
        return client.messages.with_raw_response.create(
            model="claude-live",
            max_tokens=64,
            system=system,  # type: ignore[arg-type]  # blocks with cache_control
            messages=messages,  # type: ignore[arg-type]  # the SDK's TypedDicts
            metadata={"user_id": "u-1"},
            extra_headers={"anthropic-beta": "interleaved-thinking-2025-05-14, effort-2025-11-24"},
            extra_body={
                "top_k": 5,
                "thinking": {"type": "enabled", "budget_tokens": 32},
                "output_config": {"effort": "low"},
                "svc_tags": {"team": "a"},
            },
        )

    raw = await run(gw, token, create)
    message = raw.parse()
    sent = fake.bodies[-1]
    assert sent == {
        "model": "claude-up",
        "max_tokens": 64,
        "system": system,
        "messages": messages,
        "top_k": 5,
        "thinking": {"type": "enabled", "budget_tokens": 32},
        "output_config": {"effort": "low"},
        "stream": False,
    }  # metadata and svc_tags are the gateway's: not forwarded
    assert fake.headers[-1]["anthropic-beta"] == "interleaved-thinking-2025-05-14,effort-2025-11-24"
    assert fake.headers[-1]["x-api-key"] == OUR_KEY
    assert "authorization" not in fake.headers[-1]
    request_id = raw.headers["x-request-id"]
    assert message.id == "msg_" + request_id.removeprefix("req_")
    assert message.model == "claude-live" and message.stop_reason == "end_turn"
    body = orjson.loads(raw.http_response.content)
    assert body["svc"] == {"request_id": request_id, "ignored_parameters": []}
    usage = message.usage
    assert (usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (100, 50)
    after = await state(gw, token, request_id)
    record = after["record"]
    assert record["endpoint"] == "messages" and record["tags"] == {"team": "a"}
    assert record["usage"]["prompt_tokens"] == usage.input_tokens + 150
    assert settled(after) == cache_cost(usage.input_tokens, 100, 50, usage.output_tokens)


async def test_a_stream_is_relayed_and_settled_from_its_usage(
    gw: Gateway, fake: FakeAnthropic
) -> None:
    token = await live_key(gw)
    messages = [{"role": "user", "content": "count [[cache read=40 write=8]]"}]

    def streamed(client: anthropic.Anthropic) -> tuple[Any, str]:
        with client.messages.stream(
            model="claude-opus-5-5", max_tokens=64, messages=messages,  # type: ignore[arg-type]
            stop_sequences=["delta"],
        ) as stream:  # fmt: skip
            return stream.get_final_message(), stream.response.headers["x-request-id"]

    message, request_id = await run(gw, token, streamed)
    assert fake.bodies[-1]["stream"] is True and fake.bodies[-1]["model"] == "claude-up"
    # the stop sequence that ended the text, relayed from the upstream's message_delta
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "delta")
    assert message.model == "claude-live"
    usage = message.usage
    assert (usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (40, 8)
    after = await state(gw, token, request_id)
    assert after["record"]["stream"] is True
    assert after["record"]["usage"]["cached_input_tokens"] == 40
    assert settled(after) == cache_cost(usage.input_tokens, 40, 8, usage.output_tokens)
    assert after["reserved"] == 0 and after["in_flight"] == 0


async def test_a_stream_failing_after_its_first_byte_ends_with_an_error_event(
    gw: Gateway,
) -> None:
    token = await live_key(gw)
    text = "[[fault error_after=1]] say hello"
    body = {"model": "claude-live", "max_tokens": 64, "stream": True,
            "messages": [{"role": "user", "content": text}]}  # fmt: skip
    async with gw.client(token) as client:
        response = await client.post("/v1/messages", json=body)
    assert response.status_code == 200
    events = events_of(response.text)
    assert events[0]["type"] == "message_start"
    assert events[-1]["type"] == "error" and events[-1]["error"]["code"]
    assert "message_stop" not in [event["type"] for event in events]
    after = await state(gw, token, response.headers["x-request-id"])
    assert after["reserved"] == 0 and after["in_flight"] == 0


async def test_an_upstream_refusal_before_the_stream_is_an_http_error(gw: Gateway) -> None:
    token = await live_key(gw)
    body = {"model": "claude-live", "max_tokens": 64, "stream": True,
            "messages": [{"role": "user", "content": "[[fault status=429]] hello"}]}  # fmt: skip
    async with gw.client(token) as client:
        response = await client.post("/v1/messages", json=body)
    assert response.status_code == 429
    assert response.json()["type"] == "error"
    assert response.json()["error"]["type"] == "rate_limit_error"
    assert response.headers["retry-after"]
    after = await state(gw, token, response.headers["x-request-id"])
    assert settled(after) == 0


def claude_code_body(model: str) -> dict[str, Any]:
    """A request as Claude Code 2.1.332 sends it (issue 36), texts made up."""
    tool_names = ["Bash", "Edit", "Glob", "Grep", "LS", "MultiEdit", "NotebookEdit", "Read",
                  "Task", "TodoWrite", "WebFetch", "Write"]  # fmt: skip
    tools: list[dict[str, Any]] = [
        {
            "name": name,
            "description": f"The {name} tool.",
            "input_schema": {
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "properties": {"arg": {"type": "string", "description": "what to act on"}},
                "required": ["arg"],
                "additionalProperties": False,
            },
        }
        for name in tool_names
    ]
    tools[-2]["defer_loading"] = True
    return {
        "model": model,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>context</system-reminder>"},
                    {"type": "text", "text": "say hi"},
                ],
            },
            {
                "role": "system",
                "content": [
                    {"type": "text", "text": "x" * 9000, "cache_control": {"type": "ephemeral"}}
                ],
            },
        ],
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332"},
            {
                "type": "text",
                "text": "You are Claude Code.",
                "cache_control": {"type": "ephemeral"},
            },
            {"type": "text", "text": "Tools and rules.", "cache_control": {"type": "ephemeral"}},
        ],
        "tools": tools,
        "metadata": {
            "user_id": orjson.dumps({"device_id": "d" * 64, "session_id": "s-1"}).decode()
        },
        "max_tokens": 128000,
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "medium"},
        "stream": True,
    }


CLAUDE_CODE_HEADERS = {
    "anthropic-version": "2023-06-01",
    "anthropic-beta": ",".join(BETAS),
    "x-app": "cli",
    "X-Claude-Code-Session-Id": "s-1",
    "X-Stainless-Lang": "js",
    "X-Stainless-Package-Version": "0.70.0",
    "Accept-Encoding": "gzip, deflate, br, zstd",
}


async def claude_code_call(gw: Gateway, token: str, model: str) -> tuple[Any, list[Any]]:
    async with gw.client(token) as client:
        response = await client.post(
            "/v1/messages?beta=true", json=claude_code_body(model), headers=CLAUDE_CODE_HEADERS
        )
    assert response.status_code == 200, response.text
    return response, events_of(response.text)


async def test_claude_codes_request_is_passed_through_to_an_anthropic_deployment(
    gw: Gateway, fake: FakeAnthropic
) -> None:
    token = await live_key(gw, max_output_tokens=128000)
    response, events = await claude_code_call(gw, token, "claude-opus-5-5")
    sent = claude_code_body("claude-up")
    del sent["metadata"]
    assert fake.bodies[-1] == sent  # every field as Claude Code sent it, defer_loading too
    assert fake.headers[-1]["anthropic-beta"] == ",".join(BETAS)
    kinds = [event["type"] for event in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    start = events[0]["message"]
    assert start["model"] == "claude-live"  # the catalog id of the alias called
    assert start["svc"]["ignored_parameters"] == []
    # the fake answers a call of the first tool offered
    block = next(e for e in events if e["type"] == "content_block_start")["content_block"]
    assert block["type"] == "tool_use" and block["name"] == "Bash"
    assert events[-2]["delta"]["stop_reason"] == "tool_use"
    record = (await state(gw, token, response.headers["x-request-id"]))["record"]
    assert record["endpoint"] == "messages" and record["status"] == "succeeded"


async def test_claude_codes_request_is_translated_for_an_openai_deployment(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    token = await live_key(gw, max_output_tokens=128000)
    _, events = await claude_code_call(gw, token, "gpt-live")
    sent = upstream.bodies[-1]
    assert sent["model"] == "up-chat" and sent["max_tokens"] == 128000
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "system"]
    assert len(sent["tools"]) == 12
    for name in ("thinking", "context_management", "output_config", "metadata"):
        assert name not in sent
    assert "cache_control" not in orjson.dumps(sent).decode()
    ignored = events[0]["message"]["svc"]["ignored_parameters"]
    assert set(ignored) >= {
        "thinking",
        "context_management",
        "output_config.effort",
        "cache_control",
        "defer_loading",
    }
    assert [e["type"] for e in events][-1] == "message_stop"


async def test_claude_codes_output_budget_above_the_key_limit_says_how_to_fix_it(
    gw: Gateway,
) -> None:
    token = await live_key(gw)  # the default max_output_tokens, 4096
    async with gw.client(token) as client:
        response = await client.post(
            "/v1/messages?beta=true",
            json=claude_code_body("claude-opus-5-5"),
            headers=CLAUDE_CODE_HEADERS,
        )
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "max_tokens_exceeds_key_limit",
        "max_tokens",
    )
    assert "CLAUDE_CODE_MAX_OUTPUT_TOKENS=4096" in error["message"]
    assert "max_output_tokens" in error["message"]


async def test_count_tokens_asks_an_anthropic_deployment(
    gw: Gateway, fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live key on an ``anthropic`` model: the upstream's count (its answer's fields
    stripped, as count_tokens refuses them); a failing or slow upstream: the estimate."""
    token = await live_key(gw)
    messages = [{"role": "user", "content": "Count the words of this question, please."}]
    counted = await run(
        gw, token, lambda c: c.messages.count_tokens(model="claude-live", messages=messages)
    )
    assert fake.bodies[-1] == {"model": "claude-up", "messages": messages}
    assert counted.input_tokens == len(orjson.dumps(messages).decode().split())
    estimate = parse_messages({"model": "claude-live", "messages": messages}, 4096,
                              counting=True).prompt_estimate()  # fmt: skip
    assert counted.input_tokens < estimate
    failing = [{"role": "user", "content": "[[fault status=500]] hello"}]
    monkeypatch.setattr(counting, "COUNT_TIMEOUT_S", 0.3)
    slow = [{"role": "user", "content": "[[fault delay=2]] hello"}]
    for sent in (failing, slow):
        answer = await run(
            gw, token, lambda c, sent=sent: c.messages.count_tokens(model="claude-live",
                                                                     messages=sent)
        )  # fmt: skip
        assert (
            answer.input_tokens
            == parse_messages(
                {"model": "claude-live", "messages": sent}, 4096, counting=True
            ).prompt_estimate()
        )
