"""Chat completions back to the Responses API: whole answers and streams.

A ``chat.completion`` becomes one ``response`` object (:func:`chat_to_response`): the
assistant's text (and refusal) as one ``message`` output item, each tool call as a
``function_call`` item, usage as input/output tokens. ``finish_reason`` length makes the
response ``incomplete`` (reason max_output_tokens), content_filter too (reason
content_filter); anything else is ``completed``.

A stream of ``chat.completion.chunk`` objects becomes Responses events
(:class:`ResponseStreamTranslator`), every event with ``type`` and ``sequence_number``::

    start()   response.created, response.in_progress
    feed()    first text:      (open tool calls are closed) response.output_item.added
                               (message), response.content_part.added (output_text)
              each text delta: response.output_text.delta
              a refusal:       the same with a refusal part: response.refusal.delta
              a new tool call: (the open message is closed) response.output_item.added
                               (function_call); its argument deltas:
                               response.function_call_arguments.delta. Calls of
                               different chat indexes may interleave (parallel tool
                               calls): each keeps its own item and output_index.
    finish()  closes what is open (output_text.done / refusal.done, content_part.done,
              output_item.done; function_call_arguments.done, output_item.done), then
              response.completed — or response.incomplete, as OpenAI does — with usage
    failed()  response.failed; response.error carries the gateway's code and message

Item ids derive from the response id (``msg_<rid>``, then ``msg_<rid>_<n>`` for text
after a tool call; ``fc_<rid>_<n>``) so the same answer under the same id translates
the same way. Items of an ``incomplete`` response are ``incomplete`` too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.calls.parse import ChatCall

INCOMPLETE_REASONS = {"length": "max_output_tokens", "content_filter": "content_filter"}


def chat_to_response(
    completion: dict[str, Any], call: ChatCall, response_id: str
) -> dict[str, Any]:
    """An OpenAI ``response`` object for a ``chat.completion``."""
    choice = (completion.get("choices") or [{}])[0]
    status, details = _status(choice.get("finish_reason"))
    item_status = "completed" if status == "completed" else "incomplete"
    message = choice.get("message") or {}
    content, refusal = message.get("content"), message.get("refusal")
    tool_calls = message.get("tool_calls") or []
    parts: list[dict[str, Any]] = []
    if content or not (tool_calls or refusal):
        parts.append(_output_text(content or ""))
    if refusal:
        parts.append({"type": "refusal", "refusal": refusal})
    rid = _rid(response_id)
    output: list[dict[str, Any]] = []
    if parts:
        output.append(_message_item(f"msg_{rid}", parts, item_status))
    for index, tool_call in enumerate(tool_calls):
        function = tool_call.get("function") or {}
        output.append(
            _function_call_item(
                f"fc_{rid}_{index}",
                tool_call.get("id", ""),
                function.get("name", ""),
                function.get("arguments", ""),
                item_status,
            )
        )
    response = response_shell(call, response_id, completion.get("created", 0), status)
    response.update(
        output=output, incomplete_details=details, usage=response_usage(completion.get("usage"))
    )
    return response


class ResponseStreamTranslator:
    """Chat completion chunks in, Responses stream events out (see the module docstring)."""

    def __init__(
        self,
        call: ChatCall,
        response_id: str,
        created_at: int | None = None,
        svc: dict[str, Any] | None = None,
    ) -> None:
        self._call = call
        self._id = response_id
        self._rid = _rid(response_id)
        # created_at: the stream starts before the first chunk (and its "created") arrives
        self._created_at = int(time.time()) if created_at is None else created_at
        #: the svc block, carried by every Response object of the stream
        self._svc = svc
        self._sequence = 0
        self._done: list[dict[str, Any]] = []  # closed items, in output order
        self._added = 0  # items added so far: the next item's output_index
        self._message: _OpenMessage | None = None
        self._messages = 0
        self._tools: dict[int, _OpenTool] = {}  # open function_call items by chat index
        self._tool_count = 0
        self._finish_reason: str | None = None
        self._usage: dict[str, Any] | None = None

    def served_by(self, model_id: str) -> None:
        """A fallback model serves the call (before its first event): the answer names it."""
        self._call = replace(self._call, model=model_id)

    def start(self) -> list[dict[str, Any]]:
        return [
            self._event("response.created", response=self._response("in_progress")),
            self._event("response.in_progress", response=self._response("in_progress")),
        ]

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        self._usage = chunk.get("usage") or self._usage
        for delta, finish_reason in first_choice_deltas(chunk):
            if delta.get("content"):
                events += self._part_delta("output_text", delta["content"])
            if delta.get("refusal"):
                events += self._part_delta("refusal", delta["refusal"])
            for tool_call in delta.get("tool_calls") or ():
                events += self._tool_delta(tool_call)
            self._finish_reason = finish_reason or self._finish_reason
        return events

    def finish(self) -> list[dict[str, Any]]:
        status, details = _status(self._finish_reason)
        item_status = "completed" if status == "completed" else "incomplete"
        events = self._close_message(item_status) + self._close_tools(item_status)
        response = self._response(status)
        response.update(incomplete_details=details, usage=response_usage(self._usage))
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return [*events, self._event(kind, response=response)]

    def failed(self, code: str, message: str) -> dict[str, Any]:
        response = self._response("failed")
        response["error"] = {"code": code, "message": message}
        return self._event("response.failed", response=response)

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def _response(self, status: str) -> dict[str, Any]:
        response = response_shell(self._call, self._id, self._created_at, status)
        response["output"] = list(self._done)
        if self._svc is not None:
            response["svc"] = self._svc
        return response

    # -- message items: text and refusal parts ----------------------------------------

    def _part_delta(self, kind: str, text: str) -> list[dict[str, Any]]:
        """A text (``output_text``) or refusal delta of the assistant's message."""
        events = self._close_tools()
        message = self._message
        if message is None:
            # the first message keeps the id a whole answer gives it; later ones count on
            item_id = f"msg_{self._rid}" + (f"_{self._messages}" if self._messages else "")
            self._messages += 1
            message = self._message = _OpenMessage(item_id, self._added)
            self._added += 1
            item = _message_item(item_id, [], "in_progress")
            events.append(
                self._event("response.output_item.added", output_index=message.index, item=item)
            )
        place = message.place(kind)
        if place is None:
            message.parts.append({"type": kind, _FIELD[kind]: ""})
            place = len(message.parts) - 1
            events.append(
                self._event(
                    "response.content_part.added",
                    **message.at(place),
                    part=_empty_part(kind),
                )
            )
        message.parts[place][_FIELD[kind]] += text
        extra: dict[str, list[Any]] = {"logprobs": []} if kind == "output_text" else {}
        events.append(self._event(_DELTA[kind], **message.at(place), delta=text, **extra))
        return events

    def _close_message(self, status: str = "completed") -> list[dict[str, Any]]:
        message = self._message
        if message is None:
            return []
        events = []
        parts = []
        for place, part in enumerate(message.parts):
            kind = part["type"]
            final = _output_text(part["text"]) if kind == "output_text" else dict(part)
            extra: dict[str, list[Any]] = {"logprobs": []} if kind == "output_text" else {}
            name = _FIELD[kind]
            done = {name: part[name], **extra}
            events.append(self._event(_DONE[kind], **message.at(place), **done))
            events.append(
                self._event("response.content_part.done", **message.at(place), part=final)
            )
            parts.append(final)
        item = _message_item(message.id, parts, status)
        events.append(
            self._event("response.output_item.done", output_index=message.index, item=item)
        )
        self._done.append(item)
        self._message = None
        return events

    # -- function_call items -----------------------------------------------------------

    def _tool_delta(self, tool_call: dict[str, Any]) -> list[dict[str, Any]]:
        """A piece of a tool call. Calls of different chat indexes may interleave (parallel
        tool calls): each index keeps its own item, open until the message ends."""
        events: list[dict[str, Any]] = []
        function = tool_call.get("function") or {}
        index = tool_call.get("index", 0)
        tool = self._tools.get(index)
        if tool is None:
            events += self._close_message()
            item_id = f"fc_{self._rid}_{self._tool_count}"
            self._tool_count += 1
            tool = self._tools[index] = _OpenTool(
                _function_call_item(
                    item_id,
                    tool_call.get("id") or "",
                    function.get("name") or "",
                    "",
                    "in_progress",
                ),
                self._added,
            )
            self._added += 1
            events.append(
                self._event(
                    "response.output_item.added", output_index=tool.index, item=dict(tool.item)
                )
            )
        else:  # a provider may name the call in a later piece
            tool.item["call_id"] = tool.item["call_id"] or tool_call.get("id") or ""
            tool.item["name"] = tool.item["name"] or function.get("name") or ""
        arguments = function.get("arguments")
        if arguments:
            tool.item["arguments"] += arguments
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=tool.item["id"],
                    output_index=tool.index,
                    delta=arguments,
                )
            )
        return events

    def _close_tools(self, status: str = "completed") -> list[dict[str, Any]]:
        events = []
        for tool in sorted(self._tools.values(), key=lambda tool: tool.index):
            item = {**tool.item, "status": status}
            events += [
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=tool.index,
                    arguments=item["arguments"],
                ),
                self._event("response.output_item.done", output_index=tool.index, item=item),
            ]
            self._done.append(item)
        self._tools.clear()
        return events


#: per content part kind: the part's text field, and its delta and done events
_FIELD = {"output_text": "text", "refusal": "refusal"}
_DELTA = {"output_text": "response.output_text.delta", "refusal": "response.refusal.delta"}
_DONE = {"output_text": "response.output_text.done", "refusal": "response.refusal.done"}


def _empty_part(kind: str) -> dict[str, Any]:
    return _output_text("") if kind == "output_text" else {"type": "refusal", "refusal": ""}


@dataclass(slots=True)
class _OpenMessage:
    """The message item being streamed: its id, output index and parts so far."""

    id: str
    index: int
    parts: list[dict[str, Any]] = field(default_factory=list)

    def place(self, kind: str) -> int | None:
        """The content index of the open part of ``kind``, if any."""
        for place, part in enumerate(self.parts):
            if part["type"] == kind:
                return place
        return None

    def at(self, place: int) -> dict[str, Any]:
        return {"item_id": self.id, "output_index": self.index, "content_index": place}


@dataclass(slots=True)
class _OpenTool:
    """A function_call item being streamed, and its output index."""

    item: dict[str, Any]
    index: int


def first_choice_deltas(chunk: dict[str, Any]) -> list[tuple[dict[str, Any], str | None]]:
    """The delta and finish_reason of a chunk's first choice (index 0): the only one
    the gateway asks for (n is 1)."""
    return [
        (choice.get("delta") or {}, choice.get("finish_reason"))
        for choice in chunk.get("choices") or ()
        if choice.get("index", 0) == 0
    ]


def response_shell(
    call: ChatCall, response_id: str, created_at: float, status: str
) -> dict[str, Any]:
    """A ``response`` object without output, echoing the call's settings in responses terms."""
    params = call.params
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "max_output_tokens": call.max_tokens,
        "model": call.model,
        "output": [],
        "parallel_tool_calls": params.get("parallel_tool_calls", True),
        "temperature": params.get("temperature"),
        "top_p": params.get("top_p"),
        "text": {"format": _text_format(params.get("response_format"))},
        "tool_choice": params.get("tool_choice", "auto"),
        "tools": _response_tools(params),
        "usage": None,
        "user": params.get("user"),
    }


def response_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Chat usage in responses terms; None when the provider reported none."""
    if not usage:
        return None
    prompt = usage.get("prompt_tokens", 0)
    output = usage.get("completion_tokens", 0)
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") or 0
    written = details.get("cache_write_tokens") or 0
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": written},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": usage.get("total_tokens") or prompt + output,
    }


def _status(finish_reason: str | None) -> tuple[str, dict[str, str] | None]:
    reason = INCOMPLETE_REASONS.get(finish_reason or "")
    return ("completed", None) if reason is None else ("incomplete", {"reason": reason})


def _rid(response_id: str) -> str:
    return response_id.removeprefix("resp_")


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def _message_item(item_id: str, parts: list[dict[str, Any]], status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": parts,
    }


def _function_call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str
) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def _text_format(response_format: dict[str, Any] | None) -> dict[str, Any]:
    if response_format is None:
        return {"type": "text"}
    if response_format["type"] == "json_schema":
        return {"type": "json_schema", **response_format.get("json_schema", {})}
    return {"type": response_format["type"]}


def _response_tools(params: dict[str, Any]) -> list[dict[str, Any]]:
    tools = [
        {"type": "function", **tool["function"]}
        for tool in params.get("tools", ())
        if tool.get("type") == "function" and isinstance(tool.get("function"), dict)
    ]
    if "web_search_options" in params:
        tools.append({"type": "web_search"})
    return tools
