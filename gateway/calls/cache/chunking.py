"""A cached chat answer in the other form: a stream's chunks as one completion, a
completion as stream chunks (:mod:`gateway.calls.cache`: a streamed call and one without a
stream share an entry). Pure functions of OpenAI's shapes."""

from __future__ import annotations

from typing import Any


def chunks_completion(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``chat.completion`` a stream of ``chat.completion.chunk`` objects spells."""
    first = chunks[0] if chunks else {}
    choices: dict[int, dict[str, Any]] = {}
    usage: dict[str, Any] | None = None
    for chunk in chunks:
        if isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            index = int(choice.get("index", 0))
            into = choices.setdefault(
                index, {"index": index, "message": {"role": "assistant", "content": None}}
            )
            delta = choice.get("delta") or {}
            message = into["message"]
            for name in ("content", "refusal"):
                if isinstance(delta.get(name), str):
                    message[name] = (message.get(name) or "") + delta[name]
            for call in delta.get("tool_calls") or ():
                _add_tool_call(message.setdefault("tool_calls", []), call)
            if choice.get("finish_reason") is not None:
                into["finish_reason"] = choice["finish_reason"]
    completion: dict[str, Any] = {
        "id": first.get("id"),
        "object": "chat.completion",
        "created": first.get("created"),
        "model": first.get("model"),
        "choices": [
            {"finish_reason": None, **choice, "logprobs": None}
            for _, choice in sorted(choices.items())
        ],
    }
    if usage is not None:
        completion["usage"] = usage
    return completion


def _add_tool_call(calls: list[dict[str, Any]], delta: dict[str, Any]) -> None:
    index = int(delta.get("index", len(calls)))
    while len(calls) <= index:
        calls.append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
    call = calls[index]
    if delta.get("id"):
        call["id"] = delta["id"]
    function = delta.get("function") or {}
    if function.get("name"):
        call["function"]["name"] += function["name"]
    if function.get("arguments"):
        call["function"]["arguments"] += function["arguments"]


#: the characters of a content delta when a completion is replayed as a stream
PIECE = 64


def completion_chunks(completion: dict[str, Any]) -> list[dict[str, Any]]:
    """The chunks of a stream that spells ``completion``: the role, the content in
    pieces, the tool calls, the finish reason, and the usage chunk."""
    head = {
        "id": completion.get("id"),
        "object": "chat.completion.chunk",
        "created": completion.get("created"),
        "model": completion.get("model"),
    }
    chunks: list[dict[str, Any]] = []
    for choice in completion.get("choices") or ():
        index, message = choice.get("index", 0), choice.get("message") or {}
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
        content = message.get("content") or ""
        deltas += [{"content": content[at : at + PIECE]} for at in range(0, len(content), PIECE)]
        if message.get("tool_calls"):
            calls = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
            deltas.append({"tool_calls": calls})
        chunks += [
            {**head, "choices": [{"index": index, "delta": delta, "finish_reason": None}]}
            for delta in deltas
        ]
        end = {"index": index, "delta": {}, "finish_reason": choice.get("finish_reason")}
        chunks.append({**head, "choices": [end]})
    if completion.get("usage") is not None:
        chunks.append({**head, "choices": [], "usage": completion["usage"]})
    return chunks
