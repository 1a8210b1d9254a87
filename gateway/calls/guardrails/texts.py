"""Where the texts of requests and answers are, in each shape the walk handles.

Each function takes a body and an ``edit`` (a text in, a text out) and returns the body
with every text passed through ``edit``, in a fixed order; the body given is never
changed. The guard collects with an ``edit`` that keeps each text, checks the list,
and, when a guardrail redacted, rebuilds the body with one that hands back the checked
texts in the same order.

Texts of a request: each message's content (a string, or its ``text`` parts), the
arguments of the tool calls it carries, tool results; for Anthropic's own shape, the
system prompt, ``text`` blocks, ``tool_use`` inputs and ``tool_result`` contents.
Texts of an answer: the content, tool-call arguments, reasoning (``reasoning_content``;
Anthropic's ``thinking`` blocks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Edit = Callable[[str], str]


def any_strings(value: Any, edit: Edit) -> Any:
    """Every string in a JSON value (a tool's input), keys left alone."""
    if isinstance(value, str):
        return edit(value)
    if isinstance(value, list):
        return [any_strings(item, edit) for item in value]
    if isinstance(value, dict):
        return {key: any_strings(item, edit) for key, item in value.items()}
    return value


def _chat_content(content: Any, edit: Edit) -> Any:
    if isinstance(content, str):
        return edit(content)
    if isinstance(content, list):
        return [
            {**part, "text": edit(part["text"])}
            if isinstance(part, dict) and isinstance(part.get("text"), str)
            else part
            for part in content
        ]
    return content


def _tool_calls(calls: Any, edit: Edit) -> Any:
    if not isinstance(calls, list):
        return calls
    edited = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("arguments"), str):
            call = {**call, "function": {**function, "arguments": edit(function["arguments"])}}
        edited.append(call)
    return edited


def chat_message(message: dict[str, Any], edit: Edit) -> dict[str, Any]:
    """A chat message (of a request, or of an answer's choice)."""
    out = dict(message)
    if "content" in out:
        out["content"] = _chat_content(out["content"], edit)
    if "tool_calls" in out:
        out["tool_calls"] = _tool_calls(out["tool_calls"], edit)
    if isinstance(out.get("reasoning_content"), str):
        out["reasoning_content"] = edit(out["reasoning_content"])
    return out


def chat_messages(messages: list[dict[str, Any]], edit: Edit) -> list[dict[str, Any]]:
    return [chat_message(m, edit) for m in messages]


def chat_completion(completion: dict[str, Any], edit: Edit) -> dict[str, Any]:
    """A chat completion's choices' messages."""
    choices = completion.get("choices")
    if not isinstance(choices, list):
        return completion
    return {
        **completion,
        "choices": [
            {**choice, "message": chat_message(choice["message"], edit)}
            if isinstance(choice, dict) and isinstance(choice.get("message"), dict)
            else choice
            for choice in choices
        ],
    }


def _block(block: Any, edit: Edit) -> Any:
    """An Anthropic content block: text, thinking, tool_use, tool_result."""
    if not isinstance(block, dict):
        return edit(block) if isinstance(block, str) else block
    kind = block.get("type")
    if kind == "text" and isinstance(block.get("text"), str):
        return {**block, "text": edit(block["text"])}
    if kind == "thinking" and isinstance(block.get("thinking"), str):
        return {**block, "thinking": edit(block["thinking"])}
    if kind in ("tool_use", "server_tool_use") and "input" in block:
        return {**block, "input": any_strings(block["input"], edit)}
    if kind == "tool_result" and "content" in block:
        return {**block, "content": anthropic_content(block["content"], edit)}
    return block


def anthropic_content(content: Any, edit: Edit) -> Any:
    if isinstance(content, str):
        return edit(content)
    if isinstance(content, list):
        return [_block(block, edit) for block in content]
    return content


def anthropic_body(body: dict[str, Any], edit: Edit) -> dict[str, Any]:
    """A Messages request as sent: its system prompt and its messages' contents."""
    out = dict(body)
    if "system" in out:
        out["system"] = anthropic_content(out["system"], edit)
    messages = out.get("messages")
    if isinstance(messages, list):
        out["messages"] = [
            {**m, "content": anthropic_content(m.get("content"), edit)}
            if isinstance(m, dict)
            else m
            for m in messages
        ]
    return out


def anthropic_message(message: dict[str, Any], edit: Edit) -> dict[str, Any]:
    """A Messages answer: its content blocks."""
    return {**message, "content": anthropic_content(message.get("content"), edit)}


def collect(rewrite: Callable[[Edit], Any]) -> list[str]:
    """The texts ``rewrite`` walks, in order."""
    texts: list[str] = []

    def keep(text: str) -> str:
        texts.append(text)
        return text

    rewrite(keep)
    return texts


def put_back(rewrite: Callable[[Edit], Any], texts: list[str]) -> Any:
    """What ``rewrite`` makes when its texts, in order, become ``texts``."""
    replacements = iter(texts)
    return rewrite(lambda _: next(replacements))
