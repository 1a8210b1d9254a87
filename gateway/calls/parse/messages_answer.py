"""Chat completions back to Anthropic's Messages API: whole answers and streams.

A ``chat.completion`` becomes one ``message`` (:func:`chat_to_message`): the assistant's
text as a ``text`` block, each tool call as a ``tool_use`` block (``arguments`` decoded
as its ``input``), ``finish_reason`` as ``stop_reason`` (the reverse of
:data:`gateway.providers.anthropic_translate.FINISH`: stop → end_turn, length →
max_tokens, tool_calls → tool_use, content_filter → refusal), and the usage as Anthropic
counts it (:func:`message_usage`: ``input_tokens`` without the cache's tokens, which have
their own fields).

A stream of ``chat.completion.chunk`` objects becomes Anthropic's events
(:class:`MessageStreamTranslator`)::

    start()   message_start (the message without content; its input_tokens the
              reservation's bound of the prompt, the count arriving in message_delta)
    feed()    text:           (the open tool_use block is closed) content_block_start
                              (text), then content_block_delta text_delta
              a new tool call: (the open block is closed) content_block_start
                              (tool_use, its id and name), its argument pieces:
                              content_block_delta input_json_delta
    finish()  content_block_stop of the open block, message_delta (stop_reason and the
              usage), message_stop
    error()   an ``error`` event, in the error dialect of this path

Blocks are sequential in Anthropic's stream: a piece of a tool call whose block was
closed already (a provider interleaving parallel calls) is dropped from the stream; the
whole answer and the settlement do not depend on it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson

from gateway.calls.parse import ChatCall
from gateway.calls.parse.translate import first_choice_deltas
from gateway.providers.anthropic_translate import FINISH

#: a chat finish_reason → Anthropic's stop_reason: the first Anthropic reason of each
STOP_REASONS = {chat: anthropic for anthropic, chat in reversed(FINISH.items())}


def stop_reason(finish_reason: str | None) -> str:
    return STOP_REASONS.get(finish_reason or "stop", "end_turn")


def stop_of(choice: dict[str, Any], call: ChatCall) -> tuple[str, str | None]:
    """``stop_reason`` and ``stop_sequence`` of a chat choice: ``stop_sequence`` with the
    sequence when the choice names one the call sent (``stop_reason``, vLLM's field,
    which the mock and the Anthropic translation fill in too); otherwise the finish
    reason's, and no sequence (an OpenAI upstream does not say whether a stop sequence
    or the model ended the text: end_turn)."""
    finish, matched = choice.get("finish_reason"), choice.get("stop_reason")
    sent = call.params.get("stop") or ()
    if finish in (None, "stop") and isinstance(matched, str) and matched in sent:
        return "stop_sequence", matched
    return stop_reason(finish), None


def message_usage(usage: dict[str, Any] | None) -> dict[str, int]:
    """Chat usage as Anthropic counts it: ``input_tokens`` are the prompt tokens neither
    read from nor written to the cache."""
    usage = usage or {}
    details = usage.get("prompt_tokens_details") or {}
    read = details.get("cached_tokens") or 0
    written = details.get("cache_write_tokens") or 0
    return {
        "input_tokens": max((usage.get("prompt_tokens") or 0) - read - written, 0),
        "output_tokens": usage.get("completion_tokens") or 0,
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": written,
    }


def message_shell(call: ChatCall, message_id: str) -> dict[str, Any]:
    """A ``message`` without content, as ``message_start`` carries it."""
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": call.model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": message_usage(None),
    }


def tool_input(arguments: str) -> Any:
    """A tool call's arguments as the ``input`` object (an unreadable string: kept as is,
    under ``arguments``, rather than failing the answer)."""
    try:
        value = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}


def chat_to_message(completion: dict[str, Any], call: ChatCall, message_id: str) -> dict[str, Any]:
    """An Anthropic ``message`` for a ``chat.completion``."""
    choice = (completion.get("choices") or [{}])[0]
    reply = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    text = reply.get("content") or reply.get("refusal")
    if text:
        content.append({"type": "text", "text": text})
    for tool_call in reply.get("tool_calls") or ():
        function = tool_call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": tool_call.get("id") or "",
                "name": function.get("name") or "",
                "input": tool_input(function.get("arguments") or ""),
            }
        )
    message = message_shell(call, message_id)
    reason, sequence = stop_of(choice, call)
    message.update(
        content=content,
        stop_reason=reason,
        stop_sequence=sequence,
        usage=message_usage(completion.get("usage")),
    )
    return message


class MessageStreamTranslator:
    """Chat completion chunks in, Anthropic stream events out (see the module docstring)."""

    def __init__(
        self,
        call: ChatCall,
        message_id: str,
        svc: dict[str, Any] | None,
        input_estimate: int = 0,
    ) -> None:
        self._call = call
        self._id = message_id
        self._svc = svc
        #: message_start's input_tokens: the reservation's bound (the count comes last)
        self._input_estimate = input_estimate
        self._index = -1  # the open block's index
        self._open: str | None = None  # "text", or "tool:<chat index>"
        self._closed_tools: set[int] = set()
        self._last: dict[str, Any] = {}  # finish_reason and stop_reason, once sent
        self._usage: dict[str, Any] | None = None

    def served_by(self, model_id: str) -> None:
        """A fallback model serves the call (before its first event): the answer names it."""
        self._call = replace(self._call, model=model_id)

    def start(self) -> list[dict[str, Any]]:
        message = message_shell(self._call, self._id)
        message["usage"]["input_tokens"] = self._input_estimate
        if self._svc is not None:
            message["svc"] = self._svc
        return [{"type": "message_start", "message": message}]

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        self._usage = chunk.get("usage") or self._usage
        for delta, finish_reason in first_choice_deltas(chunk):
            text = delta.get("content") or delta.get("refusal")
            if text:
                events += self._text(text)
            for tool_call in delta.get("tool_calls") or ():
                events += self._tool(tool_call)
            if finish_reason:
                choice = chunk["choices"][0]
                self._last = {
                    "finish_reason": finish_reason,
                    "stop_reason": choice.get("stop_reason"),
                }
        return events

    def finish(self) -> list[dict[str, Any]]:
        reason, sequence = stop_of(self._last, self._call)
        return [
            *self._close(),
            {
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": sequence},
                "usage": message_usage(self._usage),
            },
            {"type": "message_stop"},
        ]

    def _text(self, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self._open != "text":
            events += self._close()
            events.append(self._open_block("text", {"type": "text", "text": ""}))
        delta = {"type": "text_delta", "text": text}
        events.append({"type": "content_block_delta", "index": self._index, "delta": delta})
        return events

    def _tool(self, tool_call: dict[str, Any]) -> list[dict[str, Any]]:
        index = tool_call.get("index", 0)
        function = tool_call.get("function") or {}
        events: list[dict[str, Any]] = []
        if self._open != f"tool:{index}":
            if index in self._closed_tools:
                return []  # interleaved with a later call: see the module docstring
            events += self._close()
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": tool_call.get("id") or "",
                "name": function.get("name") or "",
                "input": {},
            }
            events.append(self._open_block(f"tool:{index}", block))
        arguments = function.get("arguments")
        if arguments:
            delta = {"type": "input_json_delta", "partial_json": arguments}
            events.append({"type": "content_block_delta", "index": self._index, "delta": delta})
        return events

    def _open_block(self, name: str, block: dict[str, Any]) -> dict[str, Any]:
        self._index += 1
        self._open = name
        return {"type": "content_block_start", "index": self._index, "content_block": block}

    def _close(self) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        if self._open.startswith("tool:"):
            self._closed_tools.add(int(self._open.removeprefix("tool:")))
        self._open = None
        return [{"type": "content_block_stop", "index": self._index}]
