"""Gemini's ``GenerateContentResponse`` into OpenAI's ``chat.completion`` and, event by
event, ``chat.completion.chunk``.

- the first candidate's text parts, joined (parts marked ``thought`` are the model's
  reasoning summary: not part of the answer, left out);
- its ``functionCall`` parts: ``tool_calls`` with the arguments as a JSON string and ids
  from :func:`~gateway.providers.gemini.gemini_request.tool_call_id` (carrying the
  call's ``thoughtSignature``);
- ``finishReason``: STOP ``stop`` (``tool_calls`` when the answer called a function),
  MAX_TOKENS ``length``, SAFETY, RECITATION, BLOCKLIST, PROHIBITED_CONTENT, SPII,
  IMAGE_SAFETY and a blocked prompt (``promptFeedback.blockReason``) ``content_filter``,
  anything else ``stop``;
- ``usageMetadata`` (:func:`usage_of`): input ``promptTokenCount`` (which counts
  ``cachedContentTokenCount``: the cached part) plus ``toolUsePromptTokenCount``;
  output ``candidatesTokenCount`` plus ``thoughtsTokenCount`` (Google bills thinking as
  output, so it is priced as output here too).
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from gateway.providers.base import Usage
from gateway.providers.chat_shapes import chat_completion
from gateway.providers.gemini.gemini_request import tool_call_id

FILTERED = frozenset(
    {"SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY"}
)


class Unreadable(ValueError):
    """A 200 answer that is not a GenerateContentResponse."""


def usage_of(answer: dict[str, Any]) -> Usage | None:
    """The usage an answer's ``usageMetadata`` reports; None when it reports none."""
    meta = answer.get("usageMetadata")
    if not isinstance(meta, dict) or "promptTokenCount" not in meta:
        return None
    try:
        prompt = int(meta.get("promptTokenCount") or 0)
        prompt += int(meta.get("toolUsePromptTokenCount") or 0)
        output = int(meta.get("candidatesTokenCount") or 0)
        output += int(meta.get("thoughtsTokenCount") or 0)
        cached = int(meta.get("cachedContentTokenCount") or 0)
    except (TypeError, ValueError):
        return None
    return Usage(prompt_tokens=prompt, completion_tokens=output, cached_tokens=cached)


def _candidate(answer: Any) -> dict[str, Any] | None:
    if not isinstance(answer, dict):
        raise Unreadable("the answer is not an object")
    candidates = answer.get("candidates")
    if candidates is None:
        if "promptFeedback" in answer or "usageMetadata" in answer:
            return None
        raise Unreadable("the answer has no candidates")
    if not isinstance(candidates, list):
        raise Unreadable("candidates is not an array")
    first = candidates[0] if candidates else None
    return first if isinstance(first, dict) else None


def _parts(candidate: dict[str, Any] | None) -> list[dict[str, Any]]:
    content = (candidate or {}).get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    return [part for part in parts or [] if isinstance(part, dict) and not part.get("thought")]


def _finish(reason: Any, called: bool, blocked: bool) -> str:
    if blocked or reason in FILTERED:
        return "content_filter"
    if reason == "MAX_TOKENS":
        return "length"
    return "tool_calls" if called else "stop"


def _blocked(answer: dict[str, Any]) -> bool:
    feedback = answer.get("promptFeedback")
    return isinstance(feedback, dict) and bool(feedback.get("blockReason"))


def _tool_call(part: dict[str, Any], request_id: str, index: int) -> dict[str, Any]:
    call = part["functionCall"]
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise Unreadable("a functionCall part has no name")
    arguments = orjson.dumps(call.get("args") or {}).decode()
    return {
        "id": tool_call_id(request_id, index, _signature(part)),
        "type": "function",
        "function": {"name": call["name"], "arguments": arguments},
    }


def _signature(part: dict[str, Any]) -> str | None:
    signature = part.get("thoughtSignature")
    return signature if isinstance(signature, str) and signature else None


def completion(answer: Any, request_id: str, model: str) -> tuple[dict[str, Any], Usage | None]:
    """The ``chat.completion`` of a whole answer, and its usage."""
    candidate = _candidate(answer)
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for part in _parts(candidate):
        if isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif "functionCall" in part:
            calls.append(_tool_call(part, request_id, len(calls)))
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    else:
        message["content"] = message["content"] or ""
    message["refusal"] = None
    reason = (candidate or {}).get("finishReason")
    usage = usage_of(answer)
    result = chat_completion(
        message,
        _finish(reason, bool(calls), _blocked(answer)),
        usage,
        completion_id=_completion_id(answer, request_id),
        created=int(time.time()),
        model=answer.get("modelVersion") or model,
    )
    return result, usage


def _completion_id(answer: dict[str, Any], request_id: str) -> str:
    upstream = answer.get("responseId")
    return f"chatcmpl-{upstream if isinstance(upstream, str) and upstream else request_id}"


class ChunkTranslator:
    """One stream's events into chunks: :meth:`chunks` per event, :meth:`end` at the end.

    Gemini sends each event with the usage so far (the last is the total) and the
    ``finishReason`` on the last candidate; OpenAI's order is kept: the role first,
    content and tool call deltas, one chunk with ``finish_reason``, then one with the
    usage and no choices.
    """

    def __init__(self, request_id: str, model: str) -> None:
        self.request_id = request_id
        self.model = model
        self.id = f"chatcmpl-{request_id}"
        self.created = int(time.time())
        self.started = False
        self.calls = 0
        self.reason: Any = None
        self.finished = False
        self.blocked = False
        self.usage: Usage | None = None

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }

    def chunks(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        candidate = _candidate(event)
        self.usage = usage_of(event) or self.usage
        self.blocked = self.blocked or _blocked(event)
        if isinstance(event.get("modelVersion"), str):
            self.model = event["modelVersion"]
        out: list[dict[str, Any]] = []
        if not self.started:
            self.started = True
            if isinstance(event.get("responseId"), str) and event["responseId"]:
                self.id = f"chatcmpl-{event['responseId']}"
            out.append(self._chunk({"role": "assistant", "content": ""}))
        for part in _parts(candidate):
            if isinstance(part.get("text"), str):
                if part["text"]:
                    out.append(self._chunk({"content": part["text"]}))
            elif "functionCall" in part:
                call = _tool_call(part, self.request_id, self.calls)
                out.append(self._chunk({"tool_calls": [{"index": self.calls, **call}]}))
                self.calls += 1
        if candidate is not None and candidate.get("finishReason"):
            self.reason = candidate["finishReason"]
            self.finished = True
        if self.blocked:
            self.finished = True
        return out

    def end(self) -> list[dict[str, Any]]:
        """The finish chunk and the usage chunk of a stream that ended well."""
        finish = _finish(self.reason, self.calls > 0, self.blocked)
        out = [self._chunk({}, finish)]
        if self.usage is not None:
            last = self._chunk({})
            last["choices"] = []
            last["usage"] = self.usage.as_dict()
            out.append(last)
        return out
