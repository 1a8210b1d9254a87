"""The items of a stream through the output windows (no server): a chat chunk's content,
reasoning and tool-call arguments, and Anthropic's text, thinking and tool-input deltas,
each released redacted, the rest at the text's end, a deny raised before it leaves."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.calls.guardrails.guarded_stream import GuardedItems, OnceNoted
from gateway.calls.guardrails.rules import Guardrail
from gateway.calls.guardrails.window import Denied
from gateway.config.guardrails import GuardrailConfig

pytestmark = pytest.mark.quick

PII = Guardrail.build(GuardrailConfig("pii", "pii", action="redact"))
SECRETS = Guardrail.build(GuardrailConfig("s", "secrets", action="deny"))


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip


def test_chat_content_reasoning_and_tool_arguments() -> None:
    noted: list[tuple[str, str]] = []
    items = GuardedItems([PII], OnceNoted(lambda name, verdict: noted.append((name, verdict))))
    out = [
        items.chat_chunk(chunk({"content": "mail a@exa", "reasoning_content": "card 4111 "})),
        items.chat_chunk(chunk({"content": "mple.com ok", "reasoning_content": "1111 1111 1111"})),
        items.chat_chunk(
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"to": "b@'}}]})
        ),
        items.chat_chunk(
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'x.org"}'}}]})
        ),
        items.chat_chunk(chunk({}, finish="stop")),
    ]
    deltas = [o["choices"][0]["delta"] for o in out]
    content = "".join(d.get("content", "") for d in deltas)
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    arguments = "".join(
        call["function"]["arguments"] for d in deltas for call in d.get("tool_calls", [])
    )
    assert content == "mail [REDACTED:email] ok"
    assert reasoning == "card [REDACTED:credit_card]"
    assert arguments == '{"to": "[REDACTED:email]"}'
    assert noted == [("pii", "redact")]
    assert items.windows == {}


def test_anthropic_deltas_flushed_before_the_block_stops() -> None:
    items = GuardedItems([PII], lambda name, verdict: None)

    def delta(kind: str, field: str, text: str) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": 0, "delta": {"type": kind, field: text}}

    events = [
        *items.anthropic_events(delta("text_delta", "text", "ssn 123-45-")),
        *items.anthropic_events(delta("text_delta", "text", "6789 done")),
        *items.anthropic_events({"type": "content_block_stop", "index": 0}),
    ]
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert text == "ssn [REDACTED:us_ssn] done"
    assert events[-1] == {"type": "content_block_stop", "index": 0}


def test_a_deny_is_raised_before_the_secret_leaves() -> None:
    noted: list[tuple[str, str]] = []
    items = GuardedItems([SECRETS], OnceNoted(lambda name, verdict: noted.append((name, verdict))))
    first = items.chat_chunk(chunk({"content": "the key is sk-proj-abc"}))
    assert "sk-" not in first["choices"][0]["delta"]["content"]
    with pytest.raises(Denied):
        items.chat_chunk(chunk({"content": "defghijklmnopqrstuvwxyz"}))
    assert noted == [("s", "deny")]
