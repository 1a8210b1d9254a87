"""A ConverseStream answer (``application/vnd.amazon.eventstream``) read as OpenAI chunks.

botocore's :class:`EventStreamBuffer` cuts the bytes into frames and checks their CRCs;
each frame's ``:message-type`` header says what it is and its payload is JSON:

    frame (:event-type / :exception-type)   chat.completion.chunk
    -------------------------------------  ------------------------------------------------
    event messageStart                      delta {role: assistant, content: ""}
    event contentBlockStart (toolUse)       delta tool_calls[i] {id, type, function: {name,
                                            arguments: ""}} (the structured-answer tool:
                                            nothing, its input is the content)
    event contentBlockDelta text            delta {content}
    event contentBlockDelta toolUse input   delta tool_calls[i] {function: {arguments}}
                                            (the structured-answer tool: {content})
    event contentBlockStop                  nothing
    event messageStop                       delta {}, finish_reason
    event metadata (usage)                  choices [], usage (the last chunk)
    exception throttlingException, ...      :class:`StreamException` (the provider maps it)
    error (``:error-code``)                 the same

A frame whose CRC or lengths are wrong is :class:`ProviderMalformed` (no longer readable).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
from botocore.eventstream import EventStreamBuffer, EventStreamMessage, ParserError

from gateway.providers.base import ProviderMalformed, Usage
from gateway.providers.bedrock.converse import finish_reason, usage_of


class StreamException(Exception):
    """An exception (or error) frame: its type (``throttlingException``, ...) and message."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class ChunkReader:
    """Feed it the body's bytes as they arrive; it yields the chunks they complete."""

    def __init__(self, completion_id: str, model: str, created: int, answer_tool: str | None):
        self._frames = EventStreamBuffer()
        self._base = {"id": completion_id, "object": "chat.completion.chunk", "created": created}
        self._base["model"] = model
        self._answer_tool = answer_tool
        #: contentBlockIndex → the tool call's index in tool_calls (None: the answer tool)
        self._tools: dict[int, int | None] = {}
        self._called: set[str] = set()
        #: messageStop seen: the answer is whole (metadata may follow)
        self.stopped = False
        self.usage: Usage | None = None

    def feed(self, data: bytes) -> Iterator[dict[str, Any]]:
        self._frames.add_data(data)
        try:
            for frame in self._frames:
                yield from self._chunks(frame)
        except ParserError as exc:
            raise ProviderMalformed(f"an unreadable event-stream frame ({exc})") from None

    def _chunks(self, frame: EventStreamMessage) -> Iterator[dict[str, Any]]:
        parts = frame.to_response_dict()  # (the stubs mistype .headers)
        headers, body = parts["headers"], parts["body"]
        kind = headers.get(":message-type")
        if kind == "error":
            raise StreamException(
                str(headers.get(":error-code")), str(headers.get(":error-message") or "")
            )
        try:
            payload = orjson.loads(body) if body else {}
        except orjson.JSONDecodeError:
            raise ProviderMalformed("an event-stream frame whose payload is not JSON") from None
        if not isinstance(payload, dict):
            raise ProviderMalformed("an event-stream frame whose payload is not an object")
        if kind == "exception":
            message = payload.get("message") or payload.get("Message") or ""
            raise StreamException(str(headers.get(":exception-type")), str(message))
        event = headers.get(":event-type")
        if event == "messageStart":
            yield self._chunk({"role": "assistant", "content": ""})
        elif event == "contentBlockStart":
            yield from self._block_start(payload)
        elif event == "contentBlockDelta":
            yield from self._block_delta(payload)
        elif event == "messageStop":
            self.stopped = True
            reason = finish_reason(payload.get("stopReason"), self._answer_tool, self._called)
            yield self._chunk({}, reason)
        elif event == "metadata":
            self.usage = usage_of(payload.get("usage"))
            if self.usage is not None:
                yield {**self._base, "choices": [], "usage": self.usage.as_dict()}

    def _block_start(self, payload: dict[str, Any]) -> Iterator[dict[str, Any]]:
        tool_use = (payload.get("start") or {}).get("toolUse")
        if not isinstance(tool_use, dict):
            return
        name = str(tool_use.get("name"))
        block = int(payload.get("contentBlockIndex") or 0)
        if name == self._answer_tool:
            self._tools[block] = None
            return
        index = sum(1 for i in self._tools.values() if i is not None)
        self._tools[block] = index
        self._called.add(name)
        call = {
            "index": index,
            "id": tool_use.get("toolUseId"),
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }
        yield self._chunk({"tool_calls": [call]})

    def _block_delta(self, payload: dict[str, Any]) -> Iterator[dict[str, Any]]:
        delta = payload.get("delta") or {}
        if isinstance(delta.get("text"), str):
            yield self._chunk({"content": delta["text"]})
            return
        tool_use = delta.get("toolUse")
        if not isinstance(tool_use, dict):
            return  # reasoning and other blocks: not part of an OpenAI answer
        fragment = str(tool_use.get("input") or "")
        block = int(payload.get("contentBlockIndex") or 0)
        if block not in self._tools:
            return  # input of a tool block that never started
        index = self._tools[block]
        if index is None:
            yield self._chunk({"content": fragment})
        else:
            yield self._chunk(
                {"tool_calls": [{"index": index, "function": {"arguments": fragment}}]}
            )

    def _chunk(self, delta: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}
        return {**self._base, "choices": [choice]}
