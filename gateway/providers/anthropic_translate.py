"""OpenAI chat completions ↔ Anthropic's Messages API (``anthropic-version: 2023-06-01``).

The request (:func:`messages_request`):

- ``system`` (and ``developer``) messages, wherever they stand, are lifted into the
  top-level ``system``, joined by blank lines; the other turns keep their order, and
  consecutive turns of one role are merged (Anthropic wants user and assistant turns to
  alternate). The first turn left must be a user's.
- assistant ``tool_calls`` become ``tool_use`` blocks (their ``arguments``, a JSON
  object, the ``input``); ``role: tool`` messages become ``tool_result`` blocks in a user
  turn; the ids are kept, so a call and its result match across turns.
- ``image_url`` parts: a ``data:`` URL becomes a base64 image source, an ``http(s)`` URL
  a url source. A part's ``cache_control`` (Anthropic's prompt-cache breakpoint) is kept.
- ``max_tokens`` is always sent: the smaller of ``max_tokens`` and
  ``max_completion_tokens`` (the gateway always sets ``max_tokens`` to the call's output
  ceiling, the one its reservation counted), else :data:`DEFAULT_MAX_TOKENS`.
- ``stop`` → ``stop_sequences``; ``temperature`` (OpenAI's 0-2 capped at Anthropic's
  1) and ``top_p`` as they are; ``tools`` → ``tools`` with ``input_schema``;
  ``tool_choice`` auto/none/required/a named function → auto/none/any/tool;
  ``parallel_tool_calls: false`` → ``disable_parallel_tool_use``.
- ``seed`` and ``web_search_options`` have no Anthropic counterpart: not sent, and named
  in ``svc.ignored_parameters`` (:data:`IGNORED`).
- Structured output: the 2023-06-01 Messages API has no ``response_format``. A
  ``json_schema`` (or ``json_object``) format becomes one more tool,
  :data:`ANSWER_TOOL`, whose ``input_schema`` is the schema, and ``tool_choice`` forces
  it (``any`` when the caller's own tools are offered too, so that the model may call
  one of those instead). Its input, JSON-encoded, is the answer's ``content``, and the
  turn finishes with ``stop``.

Anything else a message holds that Anthropic cannot take (audio, files) raises
:class:`Untranslatable`, which the provider answers as a refusal saying what to change.

The answer (:func:`completion`, :class:`StreamTranslator`): text blocks → ``content``,
``tool_use`` blocks → ``tool_calls`` (``arguments`` JSON-encoded), ``stop_reason`` →
``finish_reason`` (:data:`FINISH`), and the usage: ``prompt_tokens`` = ``input_tokens``
+ ``cache_read_input_tokens`` + ``cache_creation_input_tokens`` (Anthropic counts the
cache's tokens apart), of which ``cached_tokens`` and ``cache_write_tokens``. Thinking
blocks are not passed on.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from gateway.providers.base import Usage
from gateway.providers.chat_shapes import call_arguments, chat_completion

#: the output ceiling sent when the body has none (the gateway always sends one)
DEFAULT_MAX_TOKENS = 4096
#: the tool that carries a structured answer
ANSWER_TOOL = "json_answer"
#: chat-completions parameters Anthropic has no counterpart of
IGNORED = ("seed", "web_search_options")
#: Anthropic's highest temperature (OpenAI's is 2)
MAX_TEMPERATURE = 1.0
FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")


class Untranslatable(ValueError):
    """The body holds something the Messages API cannot take; the message says what."""


def messages_request(body: dict[str, Any], upstream_model: str) -> dict[str, Any]:
    """The Messages API body of an OpenAI chat-completions ``body`` (``stream`` kept)."""
    system, turns = _turns(body.get("messages") or [])
    request: dict[str, Any] = {
        "model": upstream_model,
        "max_tokens": max_tokens(body),
        "messages": turns,
    }
    if system:
        request["system"] = system
    stop = body.get("stop")
    if stop:
        request["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    if body.get("temperature") is not None:
        request["temperature"] = min(float(body["temperature"]), MAX_TEMPERATURE)
    if body.get("top_p") is not None:
        request["top_p"] = body["top_p"]
    tools = [_tool(tool) for tool in body.get("tools") or []]
    choice = _tool_choice(body.get("tool_choice"), body.get("parallel_tool_calls"))
    schema = answer_schema(body.get("response_format"))
    if schema is not None:
        answer = {
            "name": ANSWER_TOOL,
            "description": "Give the answer, as this tool's input.",
            "input_schema": schema,
        }
        if tools and (choice is None or choice["type"] != "none"):
            choice = {"type": "any"}
        else:
            tools, choice = [], {"type": "tool", "name": ANSWER_TOOL}
        tools.append(answer)
    if tools:
        request["tools"] = tools
        if choice is not None:
            request["tool_choice"] = choice
    if body.get("stream"):
        request["stream"] = True
    return request


def max_tokens(body: dict[str, Any]) -> int:
    sent = [
        value
        for value in (body.get("max_tokens"), body.get("max_completion_tokens"))
        if isinstance(value, int) and not isinstance(value, bool) and value > 0
    ]
    return min(sent) if sent else DEFAULT_MAX_TOKENS


def answer_schema(response_format: Any) -> dict[str, Any] | None:
    """The input schema of :data:`ANSWER_TOOL` for a structured ``response_format``."""
    if not isinstance(response_format, dict):
        return None
    if response_format.get("type") == "json_object":
        return {"type": "object"}
    if response_format.get("type") != "json_schema":
        return None
    spec = response_format.get("json_schema") or {}
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict) or schema.get("type") != "object":
        # a tool's input is an object: any other answer is wrapped in one
        return {"type": "object", "properties": {"value": schema or {}}, "required": ["value"]}
    return schema


def _turns(messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role in ("system", "developer"):
            system.append(_text(message.get("content")))
            continue
        if role == "tool":
            blocks = [_tool_result(message)]
            role = "user"
        elif role == "assistant":
            blocks = _assistant_blocks(message)
        else:
            blocks = _user_blocks(message.get("content"))
            role = "user"
        if not blocks:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    if not turns or turns[0]["role"] != "user":
        raise Untranslatable(
            "Anthropic needs a user message before the first assistant message; "
            "start the conversation with a user message."
        )
    return "\n\n".join(text for text in system if text), turns


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text") or part.get("refusal") or "")
            for part in content
            if isinstance(part, dict)
        )
    return ""


def _user_blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks: list[dict[str, Any]] = []
    for part in content if isinstance(content, list) else []:
        kind = part.get("type")
        if kind == "text":
            if not part.get("text"):
                continue
            block: dict[str, Any] = {"type": "text", "text": part["text"]}
        elif kind == "image_url":
            block = _image(part.get("image_url"))
        else:
            raise Untranslatable(
                f"Anthropic does not take {kind} content parts; send text or images."
            )
        if isinstance(part.get("cache_control"), dict):
            block["cache_control"] = part["cache_control"]
        blocks.append(block)
    return blocks


def _image(image: Any) -> dict[str, Any]:
    url = image.get("url") if isinstance(image, dict) else image
    if not isinstance(url, str):
        raise Untranslatable("An image_url part needs a url.")
    if url.startswith("data:"):
        head, _, data = url[5:].partition(",")
        media_type, _, encoding = head.partition(";")
        if encoding != "base64" or media_type not in IMAGE_TYPES:
            raise Untranslatable(
                "Anthropic takes base64 data URLs of JPEG, PNG, GIF or WebP images only."
            )
        return {
            "type": "image",
            "source": {"type": "base64", "media_type": media_type, "data": data},
        }
    if url.startswith(("https://", "http://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    raise Untranslatable("An image URL must be an http(s) URL or a base64 data URL.")


def _assistant_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    text = _text(message.get("content"))
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = call_arguments(function)
        if arguments is None:
            raise Untranslatable("A tool call's arguments must be a JSON object.")
        blocks.append(
            {
                "type": "tool_use",
                "id": call.get("id"),
                "name": function.get("name"),
                "input": arguments,
            }
        )
    return blocks


def _tool_result(message: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "tool_result",
        "tool_use_id": message.get("tool_call_id"),
        "content": _text(message.get("content")),
    }


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool.get("function")
    if tool.get("type") != "function" or not isinstance(function, dict):
        raise Untranslatable("Anthropic takes function tools only.")
    translated: dict[str, Any] = {
        "name": function.get("name"),
        "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
    }
    if function.get("description"):
        translated["description"] = function["description"]
    if isinstance(tool.get("cache_control"), dict):
        translated["cache_control"] = tool["cache_control"]
    return translated


def _tool_choice(choice: Any, parallel: Any) -> dict[str, Any] | None:
    if choice is None:
        translated: dict[str, Any] | None = None
    elif choice == "none":
        return {"type": "none"}
    elif choice == "auto":
        translated = {"type": "auto"}
    elif choice == "required":
        translated = {"type": "any"}
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        translated = {"type": "tool", "name": choice["function"].get("name")}
    else:
        raise Untranslatable("tool_choice must be auto, none, required or a named function.")
    if parallel is False:
        translated = {**(translated or {"type": "auto"}), "disable_parallel_tool_use": True}
    return translated


def usage_of(report: Any) -> Usage | None:
    """The :class:`Usage` of Anthropic's ``usage`` object; None when it is not one."""
    if not isinstance(report, dict):
        return None
    try:
        counts = _counts(report, {})
    except (TypeError, ValueError):
        return None
    return _usage(counts)


def _counts(report: dict[str, Any], counts: dict[str, int]) -> dict[str, int]:
    """``counts`` updated with the numbers ``report`` has (a stream's later reports
    repeat or complete the earlier ones)."""
    for name in (
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
    ):
        if report.get(name) is not None:
            counts[name] = int(report[name])
    return counts


def _usage(counts: dict[str, int]) -> Usage:
    read = counts.get("cache_read_input_tokens", 0)
    write = counts.get("cache_creation_input_tokens", 0)
    return Usage(
        prompt_tokens=counts.get("input_tokens", 0) + read + write,
        completion_tokens=counts.get("output_tokens", 0),
        cached_tokens=read,
        cache_write_tokens=write,
    )


def _finish(stop_reason: Any, tool_calls: int) -> str:
    finish = FINISH.get(stop_reason, "stop") if isinstance(stop_reason, str) else "stop"
    if finish == "tool_calls" and not tool_calls:
        return "stop"  # only the structured answer's tool was called
    return finish


def completion(message: dict[str, Any], model: str, structured: bool) -> dict[str, Any]:
    """The ``chat.completion`` of a Messages API answer (its ``usage`` in OpenAI's
    shape when it has one). ``structured``: :data:`ANSWER_TOOL` was offered."""
    texts: list[str] = []
    tool_calls: list[dict[str, Any]] = []
    for block in message.get("content") or []:
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text") or ""))
        elif kind == "tool_use" and structured and block.get("name") == ANSWER_TOOL:
            texts.append(orjson.dumps(block.get("input") or {}).decode())
        elif kind == "tool_use":
            tool_calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {
                        "name": block.get("name"),
                        "arguments": orjson.dumps(block.get("input") or {}).decode(),
                    },
                }
            )
    reply: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(texts) if texts or not tool_calls else None,
        "refusal": None,
    }
    if tool_calls:
        reply["tool_calls"] = tool_calls
    completion = chat_completion(
        reply,
        _finish(message.get("stop_reason"), len(tool_calls)),
        usage_of(message.get("usage")),
        completion_id=message.get("id") or "msg",
        created=int(time.time()),
        model=message.get("model") or model,
    )
    _stopped_by(completion["choices"][0], message)
    return completion


def _stopped_by(choice: dict[str, Any], stopped: dict[str, Any]) -> None:
    """The stop sequence Anthropic names (``stopped``: the message, or a message_delta's
    delta) as the choice's ``stop_reason``, vLLM's field (read back by
    :mod:`gateway.calls.parse.messages_answer`)."""
    sequence = stopped.get("stop_sequence")
    if stopped.get("stop_reason") == "stop_sequence" and isinstance(sequence, str):
        choice["stop_reason"] = sequence


class StreamUsage:
    """The usage a Messages stream reports so far: ``message_start``'s counts, completed
    by each ``message_delta``'s (a later report repeats or completes the earlier ones)."""

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def read(self, event: dict[str, Any]) -> bool:
        """Take the counts of ``event``; whether it reported any."""
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message")
            report = message.get("usage") if isinstance(message, dict) else None
        elif kind == "message_delta":
            report = event.get("usage")
        else:
            return False
        if not isinstance(report, dict):
            return False
        try:
            _counts(report, self._counts)
        except (TypeError, ValueError):
            return False
        return True

    @property
    def usage(self) -> Usage:
        return _usage(self._counts)


class StreamTranslator:
    """Anthropic's stream events → ``chat.completion.chunk`` dicts, as an OpenAI upstream
    streams them: the role first, then content and tool-call deltas (id and name first,
    then argument fragments), the ``finish_reason`` chunk, and a last chunk with the usage
    and no choices (at ``message_delta``, whose usage is the final count). Where the
    stream ends (``message_stop``) and its ``error`` events are the provider's to read.
    """

    __slots__ = (
        "_blocks",
        "_created",
        "_id",
        "_model",
        "_structured",
        "_tool_calls",
        "_usage",
    )

    def __init__(self, model: str, structured: bool) -> None:
        self._model = model
        self._structured = structured
        self._id = "msg"
        self._created = int(time.time())
        #: per content block index: the tool call's index, -1 for content, None: skipped
        self._blocks: dict[int, int | None] = {}
        self._tool_calls = 0
        self._usage = StreamUsage()

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }

    def feed(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        """The chunks of one event (``error`` events are the provider's to raise)."""
        kind = event.get("type")
        if kind == "content_block_delta":
            return self._delta(event)
        if kind == "content_block_start":
            return self._start(event)
        if kind == "message_start":
            message = event.get("message") or {}
            self._id = message.get("id") or self._id
            self._model = message.get("model") or self._model
            self._usage.read(event)
            return [self._chunk({"role": "assistant", "content": ""})]
        if kind == "message_delta":
            self._usage.read(event)
            delta = event.get("delta") or {}
            final = self._chunk({}, _finish(delta.get("stop_reason"), self._tool_calls))
            _stopped_by(final["choices"][0], delta)
            usage = {**self._chunk({}), "choices": [], "usage": self._usage.usage.as_dict()}
            return [final, usage]
        return []  # ping, content_block_stop, message_stop, events of later API versions

    def _start(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        index = event.get("index")
        block = event.get("content_block") or {}
        if not isinstance(index, int):
            return []
        kind = block.get("type")
        if kind == "text":
            self._blocks[index] = -1
            return [self._chunk({"content": block["text"]})] if block.get("text") else []
        if kind != "tool_use":
            self._blocks[index] = None  # thinking and server tool blocks
            return []
        if self._structured and block.get("name") == ANSWER_TOOL:
            self._blocks[index] = -1  # its input is the answer's content
            return []
        position = self._blocks[index] = self._tool_calls
        self._tool_calls += 1
        call = {
            "index": position,
            "id": block.get("id"),
            "type": "function",
            "function": {"name": block.get("name"), "arguments": ""},
        }
        return [self._chunk({"tool_calls": [call]})]

    def _delta(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        position = self._blocks.get(event.get("index"))  # type: ignore[arg-type]  # a non-int index is no block
        delta = event.get("delta") or {}
        kind = delta.get("type")
        if kind == "text_delta":
            piece = delta.get("text")
        elif kind == "input_json_delta":
            piece = delta.get("partial_json")
        else:
            return []  # thinking, signatures, citations
        if position is None or not piece:
            return []
        if position < 0:
            return [self._chunk({"content": piece})]
        call = {"index": position, "function": {"arguments": piece}}
        return [self._chunk({"tool_calls": [call]})]
