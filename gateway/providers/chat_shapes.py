"""OpenAI chat shapes the native kinds (anthropic, gemini, bedrock) share on both sides of
their translation: the arguments of a tool call an assistant message carries, and the
``chat.completion`` envelope their answers go back in."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.providers.base import Usage


def call_arguments(function: dict[str, Any]) -> dict[str, Any] | None:
    """The ``arguments`` of a tool call's ``function`` as the JSON object every native
    API wants (absent or empty: ``{}``); None when they are not a JSON object, which each
    kind refuses in its own words."""
    try:
        arguments = orjson.loads(function.get("arguments") or "{}")
    except orjson.JSONDecodeError:
        return None
    return arguments if isinstance(arguments, dict) else None


def chat_completion(
    message: dict[str, Any],
    finish_reason: str,
    usage: Usage | None,
    *,
    completion_id: str,
    created: int,
    model: str,
) -> dict[str, Any]:
    """The ``chat.completion`` whose one choice is the assistant's ``message``; its
    ``usage`` when there is one."""
    completion: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}
        ],
    }
    if usage is not None:
        completion["usage"] = usage.as_dict()
    return completion
