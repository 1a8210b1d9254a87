"""OpenAI chat-completions bodies to Bedrock Converse requests, Converse answers back.

The request (``POST /model/{modelId}/converse`` and ``/converse-stream``)::

    OpenAI chat body                       Converse request
    -------------------------------------  ---------------------------------------------
    system messages (text)                 system: [{text}]
    user / assistant content (text)        messages[].content[]: {text}
    image_url with a data: URL             {image: {format, source: {bytes: base64}}}
    assistant tool_calls                   {toolUse: {toolUseId: id, name, input: {...}}}
    tool messages                          a user turn of {toolResult: {toolUseId,
                                           content: [{text}]}}; consecutive turns of one
                                           role merge into one (Converse alternates roles)
    max_tokens temperature top_p stop      inferenceConfig: maxTokens temperature topP
                                           stopSequences
    tools, tool_choice auto                toolConfig: {tools: [{toolSpec: {name,
                                           description, inputSchema: {json}}}],
                                           toolChoice: {auto: {}}}
    response_format json_schema            a forced tool of that schema (toolChoice
      (json_object: schema {type: object}) {tool: {name}}, {any: {}} beside the caller's
                                           tools); its input is the answer's content
    seed, parallel_tool_calls,             not sent (Converse has none of them): named in
      tool_choice none                     svc.ignored_parameters (none: the tools are
                                           still sent, for the tool turns of the history)

An image by http(s) URL is refused (400) before any call: Converse takes image bytes only.

The answer: text blocks join into ``content``, toolUse blocks become ``tool_calls`` (ids
kept), ``stopReason`` becomes ``finish_reason`` (:data:`FINISH_REASONS`), and ``usage``
counts every input token: Converse's ``inputTokens`` excludes the cache reads and writes,
so ``prompt_tokens`` = inputTokens + cacheReadInputTokens + cacheWriteInputTokens.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.providers.base import ProviderMalformed, ProviderRefused, Usage
from gateway.providers.chat_shapes import call_arguments, chat_completion

#: Converse ``stopReason`` → OpenAI ``finish_reason``
FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "guardrail_intervened": "content_filter",
    "content_filtered": "content_filter",
}
#: the chat parameters Converse has no field for (sent: named in svc.ignored_parameters)
IGNORED = ("seed", "parallel_tool_calls")
IMAGE_FORMATS = {"png": "png", "jpeg": "jpeg", "jpg": "jpeg", "gif": "gif", "webp": "webp"}
#: the forced tool's name when a json_object answer (no schema name) is asked for
JSON_TOOL = "json_answer"
DATA_URL_ONLY = (
    "Bedrock takes images only as inline data: send the image as a data URL "
    "(data:image/png;base64,...) instead of a web address"
)


@dataclass(frozen=True, slots=True)
class ConverseCall:
    """A Converse request body, and the name of the tool that carries a structured
    answer (None: no response_format asked for one)."""

    body: dict[str, Any]
    answer_tool: str | None = None


def ignored_parameters(body: dict[str, Any]) -> list[str]:
    ignored = [name for name in IGNORED if name in body]
    if body.get("tool_choice") == "none" and body.get("tools"):
        ignored.append("tool_choice")
    return ignored


def converse_request(body: dict[str, Any]) -> ConverseCall:
    """The Converse request of an OpenAI chat body (refused 400 when it cannot be one)."""
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for message in body.get("messages") or []:
        role = message.get("role")
        if role in ("system", "developer"):
            system.extend({"text": text} for text in _texts(message.get("content")) if text)
            continue
        if role == "tool":
            text = "".join(_texts(message.get("content"))) or " "
            result = {
                "toolUseId": str(message.get("tool_call_id") or ""),
                "content": [{"text": text}],
            }
            _append(turns, "user", [{"toolResult": result}])
        elif role == "assistant":
            _append(turns, "assistant", _assistant_blocks(message))
        else:
            _append(turns, "user", _user_blocks(message.get("content")))
    request: dict[str, Any] = {"messages": turns}
    if system:
        request["system"] = system
    inference = _inference_config(body)
    if inference:
        request["inferenceConfig"] = inference
    tools = [_tool_spec(tool) for tool in body.get("tools") or [] if isinstance(tool, dict)]
    answer_tool = _answer_tool(body.get("response_format"))
    choice: dict[str, Any] = {"auto": {}}
    if answer_tool is not None:
        choice = {"any": {}} if tools else {"tool": {"name": answer_tool["toolSpec"]["name"]}}
        tools.append(answer_tool)
    if tools:
        request["toolConfig"] = {"tools": tools, "toolChoice": choice}
    name = answer_tool["toolSpec"]["name"] if answer_tool is not None else None
    return ConverseCall(request, name)


def _append(turns: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    """Add a turn; one of the same role as the last merges into it (Converse wants the
    roles to alternate: tool results and the next user text are one user turn)."""
    if not blocks:
        return
    if turns and turns[-1]["role"] == role:
        turns[-1]["content"].extend(blocks)
    else:
        turns.append({"role": role, "content": blocks})


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [str(part.get("text") or "") for part in content if part.get("type") == "text"]
    return []


def _user_blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"text": content}] if content else []
    blocks: list[dict[str, Any]] = []
    for part in content or []:
        kind = part.get("type")
        if kind == "text":
            if part.get("text"):
                blocks.append({"text": str(part["text"])})
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            blocks.append(_image_block(str(url or "")))
        else:
            raise ProviderRefused(400, f"Bedrock takes text and image parts, not {kind!r} parts")
    return blocks


def _image_block(url: str) -> dict[str, Any]:
    head, comma, data = url.partition(",")
    if not url.startswith("data:") or not comma or not head.endswith(";base64"):
        raise ProviderRefused(400, DATA_URL_ONLY)
    media = head[5:].removesuffix(";base64").lower()
    subtype = media.removeprefix("image/")
    if not media.startswith("image/") or subtype not in IMAGE_FORMATS:
        raise ProviderRefused(400, "Bedrock takes png, jpeg, gif and webp images only")
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ProviderRefused(400, "the image's data URL is not valid base64") from None
    return {"image": {"format": IMAGE_FORMATS[subtype], "source": {"bytes": data}}}


def _assistant_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [{"text": t} for t in _texts(message.get("content")) if t]
    if not blocks and isinstance(message.get("refusal"), str) and message["refusal"]:
        blocks.append({"text": message["refusal"]})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = call_arguments(function)
        if arguments is None:
            raise ProviderRefused(400, "a tool call's arguments must be a JSON object")
        tool_use = {"toolUseId": str(call.get("id") or ""), "name": str(function.get("name"))}
        blocks.append({"toolUse": {**tool_use, "input": arguments}})
    return blocks


def _inference_config(body: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    if body.get("max_tokens") is not None:
        config["maxTokens"] = body["max_tokens"]
    if body.get("temperature") is not None:
        config["temperature"] = body["temperature"]
    if body.get("top_p") is not None:
        config["topP"] = body["top_p"]
    stop = body.get("stop")
    if stop:
        config["stopSequences"] = [stop] if isinstance(stop, str) else list(stop)
    return config


def _tool_spec(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool.get("function") or {}
    schema = function.get("parameters") or {"type": "object", "properties": {}}
    spec: dict[str, Any] = {"name": function.get("name"), "inputSchema": {"json": schema}}
    if function.get("description"):
        spec["description"] = function["description"]
    return {"toolSpec": spec}


def _answer_tool(response_format: Any) -> dict[str, Any] | None:
    """The forced tool that carries a structured answer (Converse has no JSON mode)."""
    if not isinstance(response_format, dict):
        return None
    if response_format.get("type") == "json_schema":
        spec = response_format.get("json_schema") or {}
        schema = spec.get("schema") or {"type": "object"}
        name = spec.get("name") or JSON_TOOL
        description = spec.get("description") or "Give the answer in this shape."
    elif response_format.get("type") == "json_object":
        schema, name, description = {"type": "object"}, JSON_TOOL, "Give the answer as JSON."
    else:
        return None
    return {"toolSpec": {"name": name, "description": description, "inputSchema": {"json": schema}}}


# ---------------------------------------------------------------- answers


def usage_of(data: Any) -> Usage | None:
    """The usage a Converse ``usage`` object reports (cache reads and writes are parts of
    ``prompt_tokens``); None when there is none."""
    if not isinstance(data, dict):
        return None
    try:
        read = int(data.get("cacheReadInputTokens") or 0)
        written = int(data.get("cacheWriteInputTokens") or 0)
        return Usage(
            prompt_tokens=int(data.get("inputTokens") or 0) + read + written,
            completion_tokens=int(data.get("outputTokens") or 0),
            cached_tokens=read,
            cache_write_tokens=written,
        )
    except (TypeError, ValueError):
        return None


def finish_reason(stop_reason: Any, answer_tool: str | None, called: set[str]) -> str:
    """A forced structured-answer tool is the answer itself: it stops, not tool_calls."""
    if stop_reason == "tool_use" and answer_tool is not None and called <= {answer_tool}:
        return "stop"
    return FINISH_REASONS.get(str(stop_reason), "stop")


def completion(
    answer: Any, *, completion_id: str, model: str, created: int, answer_tool: str | None
) -> tuple[dict[str, Any], Usage | None]:
    """The ``chat.completion`` of a Converse answer, and its usage."""
    try:
        blocks = answer["output"]["message"]["content"]
        assert isinstance(blocks, list)
    except (KeyError, TypeError, AssertionError):
        raise ProviderMalformed("the Converse answer has no output message") from None
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in blocks:
        if not isinstance(block, dict):
            continue
        if isinstance(block.get("text"), str):
            texts.append(block["text"])
        tool_use = block.get("toolUse")
        if isinstance(tool_use, dict):
            arguments = orjson.dumps(tool_use.get("input") or {}).decode()
            if tool_use.get("name") == answer_tool:
                texts.append(arguments)
                continue
            function = {"name": tool_use.get("name"), "arguments": arguments}
            calls.append(
                {"id": tool_use.get("toolUseId"), "type": "function", "function": function}
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    names = {str(call["function"]["name"]) for call in calls}
    if answer_tool is not None and not calls:
        names.add(answer_tool)
    usage = usage_of(answer.get("usage"))
    reason = finish_reason(answer.get("stopReason"), answer_tool, names)
    result = chat_completion(
        message, reason, usage, completion_id=completion_id, created=created, model=model
    )
    return result, usage
