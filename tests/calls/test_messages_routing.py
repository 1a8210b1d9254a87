"""/v1/messages over a model whose deployments differ in kind (issues 35 and 36): the
choice between passthrough and translation is made per attempt, on the provider of the
deployment tried. The first deployment refuses connections (nothing listens on its
address), so the call is served by the second: passed through when it is an
``anthropic`` deployment, translated when it is an ``openai`` one; one settlement, both
attempts on the record. Real servers: the fake Messages API and the fake OpenAI upstream.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import anthropic
import pytest
import trio

from gateway.config.settings import DeploymentConfig, ModelConfig, ProviderConfig
from gateway.fakes.fake_anthropic import FakeAnthropic
from gateway.fakes.fake_upstream import FakeUpstream
from tests.calls.test_live_settlement import settled, state
from tests.calls.test_messages_native import OUR_KEY, UPSTREAM_KEY, fake, live_key, run
from tests.calls.test_routing import refusing_url
from tests.conftest import Gateway, make_config, start_gateway

__all__ = ["fake"]  # the fixture, shared with the passthrough tests

IN, OUT = 3.0, 15.0


async def mixed_gateway(
    nursery: trio.Nursery, tmp_path: Path, claude_url: str, openai_url: str, first: str
) -> Gateway:
    """A model ``mixed`` of two deployments, ``first`` tried first (ordered)."""
    base = make_config(tmp_path)
    claude = ProviderConfig("claude", "anthropic", base_url=claude_url, api_key_env="CLAUDE_KEY")
    chat = ProviderConfig("up", "openai", base_url=openai_url, api_key_env="UP_KEY")
    deployments = {
        "claude": DeploymentConfig("claude", "claude-up"),
        "up": DeploymentConfig("up", "up-chat"),
    }
    order = (deployments[first], *(d for name, d in deployments.items() if name != first))
    model = replace(
        ModelConfig("mixed", order[0].provider, order[0].upstream_id, "chat"),
        deployments=order,
        routing="ordered",
        input_usd_per_mtok=IN,
        output_usd_per_mtok=OUT,
    )
    config = replace(base, providers=(*base.providers, claude, chat), models=(model,))
    return await start_gateway(nursery, config)


@pytest.fixture(autouse=True)
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLAUDE_KEY", OUR_KEY)
    monkeypatch.setenv("UP_KEY", UPSTREAM_KEY)


def ask(streamed: bool) -> Any:
    messages = [{"role": "user", "content": "hello there"}]

    def work(client: anthropic.Anthropic) -> tuple[Any, str]:
        if streamed:
            with client.messages.stream(
                model="mixed", max_tokens=32, messages=messages,  # type: ignore[arg-type]
                extra_body={"thinking": {"type": "enabled", "budget_tokens": 16}},
            ) as stream:  # fmt: skip
                return stream.get_final_message(), stream.response.headers["x-request-id"]
        raw = client.messages.with_raw_response.create(
            model="mixed", max_tokens=32, messages=messages,  # type: ignore[arg-type]
            extra_body={"thinking": {"type": "enabled", "budget_tokens": 16}},
        )  # fmt: skip
        return raw.parse(), raw.headers["x-request-id"]

    return work


def cost(usage: Any) -> int:
    return math.ceil((usage.input_tokens * IN + usage.output_tokens * OUT) * 1000)


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "stream"])
async def test_an_anthropic_deployment_down_the_openai_one_serves_by_translation(
    nursery: trio.Nursery, tmp_path: Path, upstream: FakeUpstream, streamed: bool
) -> None:
    gw = await mixed_gateway(nursery, tmp_path, await refusing_url(), upstream.url, "claude")
    token = await live_key(gw)
    message, request_id = await run(gw, token, ask(streamed))
    assert message.model == "mixed" and message.content[0].type == "text"
    sent = upstream.bodies[-1]
    assert sent["model"] == "up-chat" and "thinking" not in sent  # translated to chat
    after = await state(gw, token, request_id)
    record = after["record"]
    attempts = [(a["provider"], a["code"]) for a in record["attempts"]]
    assert attempts[0][0] == "claude" and attempts[0][1] is not None
    assert attempts[1] == ("up", None)
    assert record["endpoint"] == "messages" and record["status"] == "succeeded"
    assert settled(after) == cost(message.usage)
    assert after["reserved"] == 0 and after["in_flight"] == 0


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "stream"])
async def test_an_openai_deployment_down_the_anthropic_one_serves_as_sent(
    nursery: trio.Nursery, tmp_path: Path, fake: FakeAnthropic, streamed: bool
) -> None:
    gw = await mixed_gateway(nursery, tmp_path, fake.url, await refusing_url(), "up")
    token = await live_key(gw)
    message, request_id = await run(gw, token, ask(streamed))
    assert message.model == "mixed"
    sent = fake.bodies[-1]
    # passed through: thinking kept as sent, the upstream id substituted
    assert sent["model"] == "claude-up"
    assert sent["thinking"] == {"type": "enabled", "budget_tokens": 16}
    after = await state(gw, token, request_id)
    record = after["record"]
    assert [a["provider"] for a in record["attempts"]] == ["up", "claude"]
    assert record["attempts"][1]["code"] is None
    assert settled(after) == cost(message.usage)
    assert after["reserved"] == 0 and after["in_flight"] == 0
