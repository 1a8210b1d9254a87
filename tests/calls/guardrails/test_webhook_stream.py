"""A stream's items held for output webhooks (no server: the webhook is the injected
``ask`` of :class:`Guardrails`): released in order after each allow, rewritten by a
redaction, a deny marker before any held text, then the rest only for its usage."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.calls.guardrails.rules import Guardrails
from gateway.calls.guardrails.webhook_stream import (
    OPENED,
    HeldForWebhooks,
    denied,
    texts_of,
    with_texts,
)
from gateway.config.guardrails import GuardrailConfig
from gateway.providers.guardrail_webhook import WebhookFailed

pytestmark = pytest.mark.quick

HOOK = GuardrailConfig("hook", "webhook", on="output", url="http://127.0.0.1:1/x", stream_chars=10)


def chunk(content: str, finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]}


class Webhook:
    """Denies ``forbidden``, redacts ``hush``; keeps the texts it was sent."""

    def __init__(self) -> None:
        self.sent: list[list[str]] = []

    async def ask(self, config: GuardrailConfig, payload: dict[str, Any]) -> dict[str, Any]:
        texts: list[str] = payload["texts"]
        self.sent.append(list(texts))
        if any("forbidden" in text for text in texts):
            return {"verdict": "deny"}
        if any("hush" in text for text in texts):
            return {"verdict": "redact", "texts": [t.replace("hush", "***") for t in texts]}
        return {"verdict": "allow"}


async def held(pieces: list[str], webhook: Webhook) -> tuple[list[dict[str, Any]], list[str]]:
    guardrails = Guardrails.build([HOOK], ask=webhook.ask)
    noted: list[str] = []
    hold = HeldForWebhooks(
        tuple(guardrails.by_name.values()), guardrails, lambda name, v: noted.append(v)
    )

    async def upstream() -> AsyncIterator[dict[str, Any]]:
        for piece in pieces:
            yield chunk(piece)
        yield {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}

    return [item async for item in hold.items(upstream())], noted


def contents(items: list[dict[str, Any]]) -> str:
    return "".join(c["delta"].get("content", "") for i in items for c in i.get("choices", []))


async def test_released_in_segments_after_each_allow() -> None:
    webhook = Webhook()
    items, noted = await held(["abc", "defgh", "ijkl", "mn"], webhook)
    assert items[0] == OPENED
    assert contents(items[1:]) == "abcdefghijklmn"
    assert webhook.sent == [["abcdefghijkl"], ["mn"]]
    assert items[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 4}
    assert noted == []  # allows are noted at the stream's end, by the format


async def test_a_redaction_is_carried_by_the_first_held_piece() -> None:
    items, noted = await held(["say ", "hu", "sh ", "now"], Webhook())
    pieces = [c["delta"]["content"] for i in items[1:] for c in i["choices"]]
    assert pieces == ["say *** now", "", "", ""]
    assert noted == ["redact"]


async def test_a_deny_marker_comes_before_any_held_text() -> None:
    items, noted = await held(["fine text ", "forbidden", " words"], Webhook())
    at = items.index(denied("hook"))
    assert contents(items[:at]) == "fine text "
    # after the marker: the held and the remaining items, for their usage only
    assert contents(items[at + 1 :]) == "forbidden words"
    assert items[-1]["usage"]["completion_tokens"] == 4
    assert noted == ["deny"]


async def test_a_webhook_that_fails_denies() -> None:
    async def down(config: GuardrailConfig, payload: dict[str, Any]) -> dict[str, Any]:
        raise WebhookFailed("connection refused")

    webhook = Webhook()
    webhook.ask = down  # type: ignore[method-assign]
    items, noted = await held(["x" * 12, "y"], webhook)
    assert items[:2] == [OPENED, denied("hook")] and noted == ["deny"]


def test_texts_of_chat_chunks_and_anthropic_events_and_back() -> None:
    item = {
        "choices": [
            {
                "index": 0,
                "delta": {
                    "content": "a",
                    "reasoning_content": "b",
                    "tool_calls": [{"index": 1, "function": {"arguments": "{}"}}],
                },
            }
        ]
    }
    found = texts_of(item)
    assert found == [((0, "content"), "a"), ((0, "reasoning_content"), "b"), ((0, "tool", 1), "{}")]
    back = with_texts(item, {key: text.upper() for key, text in found})
    assert texts_of(back) == [
        ((0, "content"), "A"),
        ((0, "reasoning_content"), "B"),
        ((0, "tool", 1), "{}"),
    ]
    event = {
        "type": "content_block_delta",
        "index": 2,
        "delta": {"type": "thinking_delta", "thinking": "t"},
    }
    assert texts_of(event) == [((2, "thinking"), "t")]
    assert texts_of(with_texts(event, {(2, "thinking"): "T"})) == [((2, "thinking"), "T")]
