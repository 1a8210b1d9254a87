"""POST /v1/messages: Anthropic's Messages request, translated into a chat :class:`ChatCall`.

The endpoint is served by chat completions, as /v1/responses is: the call carries chat
names, and the answer is translated back by :mod:`gateway.calls.parse.messages_answer`.
The body as sent (without ``svc_tags`` and ``metadata``) rides along as
:attr:`ChatCall.native`: an ``anthropic`` deployment gets it passed through instead
(:mod:`gateway.calls.pipeline`), so what is dropped below is dropped by the translation
only. Validation and refusals are the same for both.
This is the reverse of :mod:`gateway.providers.anthropic_translate` (chat → Messages),
whose tables (finish reasons, image types) it reads rather than copies.

- ``system`` (a string or text blocks) becomes the first ``system`` message; a message
  of role ``system`` inside ``messages`` (Claude Code sends one) stays a system message
  where it stands.
- text blocks → text parts; image blocks (base64 or url source) → ``image_url`` parts;
  an assistant's ``tool_use`` blocks → ``tool_calls`` (``input`` JSON-encoded as
  ``arguments``); a user's ``tool_result`` blocks → ``role: tool`` messages placed
  before the rest of that user turn (chat wants a tool result right after its call).
- ``stop_sequences`` → ``stop``; ``temperature`` (0-1) and ``top_p`` forwarded; custom
  tools → function tools (``input_schema`` the ``parameters``); a web search server tool
  → ``web_search_options``; ``tool_choice`` auto/none (any and tool force a tool: refused
  as on the other endpoints); ``disable_parallel_tool_use`` → ``parallel_tool_calls``.
- Dropped, and named in ``svc.ignored_parameters`` (:attr:`ChatCall.dropped`):
  ``thinking`` (the field and thinking blocks), ``top_k``, ``cache_control`` on blocks,
  a tool's members a chat tool has not (``defer_loading``),
  ``context_management``, ``output_config.effort`` and any other field this gateway does
  not know (Claude Code adds fields with its betas; refusing them would break it).
- ``output_config.format`` (json_schema; or the beta's top-level ``output_format``) →
  ``response_format`` json_schema: the call needs the ``structured_output`` capability
  (refused ``model_lacks_structured_output`` without it), and each kind maps it as it
  maps chat's (docs/decisions/messages.md).
- Refused with 400 ``unsupported_parameter`` naming the field and what to do instead:
  ``container``, ``mcp_servers``, server tools other than web search, document blocks.
- ``max_tokens`` is required; above the key's ``max_output_tokens`` the refusal says how
  to fix the setup (raise the cap, or ``CLAUDE_CODE_MAX_OUTPUT_TOKENS``).
- ``metadata`` carries only ``user_id`` (checked, never forwarded, never tags); tags come
  from ``X-Svc-Tags`` and ``svc_tags`` (the tag step).
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.calls.parse import ChatCall, MessagesSource
from gateway.calls.parse.fields import (
    flag,
    forward_capabilities,
    invalid,
    number,
    obj,
    positive_int,
    require_model,
    require_object,
    string,
    tool_choice,
    unsupported,
    without_nulls,
)
from gateway.errors import GatewayError
from gateway.providers.anthropic_translate import IMAGE_TYPES

__all__ = ["IMAGE_TYPES", "KNOWN", "parse_messages"]

#: fields read (and translated) here; ``svc_tags`` is read by the tag step
KNOWN = frozenset(
    {
        "model",
        "max_tokens",
        "messages",
        "system",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "tools",
        "tool_choice",
        "metadata",
        "stream",
        "thinking",
        "service_tier",
        "svc_tags",
        "output_config",
        "output_format",
    }
)
#: accepted and dropped: what the translation cannot carry (named in ignored_parameters)
DROPPED = ("top_k", "thinking")
#: refused, with what to do instead
REFUSED = {
    "container": "Code execution containers are not available through this gateway; "
    "run the code on your side and send its output as a tool_result.",
    "mcp_servers": "This gateway does not connect to MCP servers; define the MCP "
    "server's tools as custom tools (name, input_schema) and call them yourself.",
}
#: server tool types served (as web_search_options); a prefix, as the type carries a date
WEB_SEARCH_TOOL = "web_search_"
#: what works instead of a forcing tool_choice (named in its refusal)
NO_FORCING = "a tool whose input_schema is the answer's schema, with tool_choice auto"
#: the fields of a custom tool a chat function tool carries
TOOL_FIELDS = frozenset({"type", "name", "description", "input_schema"})
#: the gateway's own fields, never passed through (``metadata``: decided, never forwarded)
NOT_PASSED = frozenset({"svc_tags", "metadata"})
#: the name of a structured answer's schema in a chat ``response_format``
ANSWER_NAME = "output"
#: the environment variable Claude Code reads for its output budget
CLAUDE_CODE_BUDGET = "CLAUDE_CODE_MAX_OUTPUT_TOKENS"


def parse_messages(body: Any, max_output_tokens: int, *, counting: bool = False) -> ChatCall:
    """Validate a Messages body; ``max_output_tokens`` is the key's cap. ``counting``:
    the body of count_tokens, which has no ``max_tokens``."""
    body = without_nulls(require_object(body))
    for name, instead in REFUSED.items():
        if name in body:
            raise unsupported(name, f"{name} is not supported by this gateway. {instead}")
    dropped = [name for name in body if name not in KNOWN] + [n for n in DROPPED if n in body]
    model = require_model(body, missing="invalid_request")
    translation = _Translation()
    messages = translation.messages(body.get("messages"))
    system = _system(body.get("system"), translation)
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    params: dict[str, Any] = {}
    for name, high in (("temperature", 1), ("top_p", 1)):
        value = number(body, name, high)
        if value is not None:
            params[name] = value
    stop = body.get("stop_sequences")
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(item, str) for item in stop):
            raise invalid("stop_sequences", "stop_sequences must be an array of strings.")
        if stop:
            params["stop"] = stop
    _metadata(body)
    string(body, "service_tier")
    stream = flag(body, "stream")
    tools, web_search = _tools(body.get("tools"), translation)
    params.update(_tool_choice(body, tools))
    answer_format = _output_format(body, translation)
    needs = forward_capabilities(params, messages, tools, answer_format, web_search)
    if "cache_control" in body:
        translation.dropped.add("cache_control")
    budget = _budget(body, max_output_tokens, counting)
    return ChatCall(
        model,
        messages,
        budget,
        stream,
        params=params,
        needs=needs,
        endpoint="messages",
        dropped=tuple(dict.fromkeys([*dropped, *sorted(translation.dropped)])),
        native=MessagesSource(
            # max_tokens as read (7.0 is 7), for a provider that takes only integers
            {k: budget if k == "max_tokens" else v for k, v in body.items() if k not in NOT_PASSED},
            unsent_tokens=translation.unsent_tokens,
        ),
    )


def _budget(body: dict[str, Any], limit: int, counting: bool) -> int:
    sent = positive_int(body, "max_tokens")
    if sent is None:
        if counting:
            return limit
        raise invalid("max_tokens", "max_tokens is required.")
    if sent > limit:
        raise GatewayError(
            "max_tokens_exceeds_key_limit",
            f"max_tokens {sent} is above this key's limit of {limit} output tokens. Send "
            f"max_tokens of at most {limit} (Claude Code: set {CLAUDE_CODE_BUDGET}={limit}), "
            "or ask an administrator to raise the key's max_output_tokens cap.",
            param="max_tokens",
        )
    return sent


def _output_format(body: dict[str, Any], translation: _Translation) -> dict[str, Any] | None:
    """``output_config.format`` (or the beta's top-level ``output_format``) as a chat
    ``response_format``; ``output_config``'s other members (``effort``) are dropped."""
    config = obj(body, "output_config") or {}
    translation.dropped.update(f"output_config.{name}" for name in config if name != "format")
    answer = config.get("format", body.get("output_format"))
    if answer is None:
        return None
    if (
        not isinstance(answer, dict)
        or answer.get("type") != "json_schema"
        or not isinstance(answer.get("schema"), dict)
    ):
        raise invalid(
            "output_config",
            'output_config.format must be {"type": "json_schema", "schema": {...}}.',
        )
    return {"type": "json_schema", "json_schema": {"name": ANSWER_NAME, "schema": answer["schema"]}}


def _metadata(body: dict[str, Any]) -> None:
    metadata = obj(body, "metadata")
    if metadata is None:
        return
    user_id = metadata.get("user_id")
    if user_id is not None and not isinstance(user_id, str):
        raise invalid("metadata", "metadata.user_id must be a string.")


def _system(value: Any, translation: _Translation) -> str | None:
    if value is None or isinstance(value, str):
        return value or None
    if not isinstance(value, list):
        raise invalid("system", "system must be a string or an array of text blocks.")
    texts = []
    for block in value:
        if not isinstance(block, dict) or block.get("type") != "text":
            raise invalid("system", "system blocks must be text blocks.")
        texts.append(translation.text(block, "system"))
    return "\n\n".join(texts)


class _Translation:
    """Messages' turns as chat messages; what was dropped on the way."""

    def __init__(self) -> None:
        self.dropped: set[str] = set()
        self.unsent_tokens = 0

    def messages(self, value: Any) -> list[dict[str, Any]]:
        if not isinstance(value, list) or not value:
            raise _bad("messages must be a non-empty array of objects.")
        messages: list[dict[str, Any]] = []
        for index, message in enumerate(value):
            if not isinstance(message, dict):
                raise _bad(f"messages[{index}] must be an object.")
            role = message.get("role")
            content = message.get("content")
            if role not in ("user", "assistant", "system"):
                raise _bad(f"messages[{index}].role must be user or assistant.")
            if isinstance(content, str):
                messages.append({"role": role, "content": content})
                continue
            if not isinstance(content, list) or not content:
                raise _bad(
                    f"messages[{index}].content must be a string or a non-empty array of blocks."
                )
            if role == "assistant":
                messages.extend(self._assistant(content, index))
            else:
                messages.extend(self._user(role, content, index))
        return messages

    def text(self, block: dict[str, Any], where: str) -> str:
        text = block.get("text")
        if not isinstance(text, str):
            raise _bad(f"A text block of {where} needs a string text.")
        if "cache_control" in block:
            self.dropped.add("cache_control")
        return text

    def _user(self, role: str, blocks: list[Any], index: int) -> list[dict[str, Any]]:
        """A user (or system) turn: its tool results first, as tool messages, then the
        rest as one message of parts."""
        results: list[dict[str, Any]] = []
        parts: list[dict[str, Any]] = []
        where = f"messages[{index}]"
        for block in blocks:
            kind = self._kind(block, where)
            if kind == "text":
                parts.append({"type": "text", "text": self.text(block, where)})
            elif kind == "image" and role == "user":
                parts.append(self._image(block, where))
            elif kind == "tool_result" and role == "user":
                result, images = self._tool_result(block, where)
                results.append(result)
                parts.extend(images)
            else:
                raise self._unreadable(kind, where)
        if role == "system" or all(part["type"] == "text" for part in parts):
            text = "\n\n".join(part["text"] for part in parts)
            turn: list[dict[str, Any]] = [{"role": role, "content": text}] if parts else []
        else:
            turn = [{"role": role, "content": parts}]
        return results + turn

    def _assistant(self, blocks: list[Any], index: int) -> list[dict[str, Any]]:
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        where = f"messages[{index}]"
        for block in blocks:
            kind = self._kind(block, where)
            if kind == "text":
                texts.append(self.text(block, where))
            elif kind == "tool_use":
                calls.append(_tool_call(block, where))
            elif kind in ("thinking", "redacted_thinking"):
                self.dropped.add("thinking")
                # the bytes of its JSON bound the tokens of its text (calls/estimate.py)
                self.unsent_tokens += len(orjson.dumps(block))
            else:
                raise self._unreadable(kind, where)
        message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
        if calls:
            message["tool_calls"] = calls
        elif message["content"] is None:
            message["content"] = ""  # an answer of thinking only: an empty turn
        return [message]

    def _kind(self, block: Any, where: str) -> str:
        kind = block.get("type") if isinstance(block, dict) else None
        if not isinstance(kind, str):
            raise _bad(f"Every block of {where}.content must be an object with a type.")
        return kind

    def _unreadable(self, kind: str, where: str) -> GatewayError:
        if kind == "document":
            return unsupported(
                "messages",
                "document blocks are not supported; send the document's text as a text block.",
            )
        return _bad(f"{where} holds a {kind} block, which this gateway cannot read here.")

    def _image(self, block: dict[str, Any], where: str) -> dict[str, Any]:
        if "cache_control" in block:
            self.dropped.add("cache_control")
        source = block.get("source")
        kind = source.get("type") if isinstance(source, dict) else None
        if kind == "base64" and isinstance(source, dict):
            media, data = source.get("media_type"), source.get("data")
            if media not in IMAGE_TYPES or not isinstance(data, str):
                raise _bad(
                    f"An image of {where} needs media_type one of {', '.join(IMAGE_TYPES)} "
                    "and base64 data."
                )
            return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}
        if kind == "url" and isinstance(source, dict) and isinstance(source.get("url"), str):
            return {"type": "image_url", "image_url": {"url": source["url"]}}
        raise _bad(f"An image of {where} needs a base64 or url source.")

    def _tool_result(
        self, block: dict[str, Any], where: str
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """A tool message, and the result's images (a chat tool message holds text only:
        they go into the user turn that follows)."""
        call_id = block.get("tool_use_id")
        if not isinstance(call_id, str):
            raise _bad(f"A tool_result of {where} needs a tool_use_id.")
        if "cache_control" in block:
            self.dropped.add("cache_control")
        content = block.get("content", "")
        images: list[dict[str, Any]] = []
        if isinstance(content, list):
            texts = []
            for part in content:
                kind = self._kind(part, where)
                if kind == "text":
                    texts.append(self.text(part, where))
                elif kind == "image":
                    images.append(self._image(part, where))
                else:
                    raise self._unreadable(kind, where)
            content = "\n\n".join(texts)
        elif not isinstance(content, str):
            raise _bad(f"A tool_result of {where} needs a string or blocks as content.")
        if block.get("is_error") is True:
            content = f"Error: {content}"
        return {"role": "tool", "tool_call_id": call_id, "content": content}, images


def _tool_call(block: dict[str, Any], where: str) -> dict[str, Any]:
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, dict):
        raise _bad(f"A tool_use block of {where} needs an id, a name and an object input.")
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": orjson.dumps(arguments).decode()},
    }


def _tools(
    value: Any, translation: _Translation
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Custom tools as chat function tools; a web search server tool as web_search_options."""
    if value is None:
        return [], None
    if not isinstance(value, list) or not all(isinstance(tool, dict) for tool in value):
        raise invalid("tools", "tools must be an array of objects.")
    tools: list[dict[str, Any]] = []
    web_search: dict[str, Any] | None = None
    for tool in value:
        kind = tool.get("type", "custom")
        if isinstance(kind, str) and kind.startswith(WEB_SEARCH_TOOL):
            web_search = {}
            continue
        if kind != "custom":
            raise unsupported(
                "tools",
                f"The server tool {kind} is not supported by this gateway (only web search "
                "is); define it as a custom tool with a name and an input_schema, and run "
                "it on your side.",
            )
        name, schema = tool.get("name"), tool.get("input_schema")
        if not isinstance(name, str) or not isinstance(schema, dict):
            raise invalid("tools", "A custom tool needs a name and an object input_schema.")
        # cache_control, defer_loading and any later field of a tool: a chat tool has none
        translation.dropped.update(set(tool) - TOOL_FIELDS)
        function: dict[str, Any] = {"name": name, "parameters": schema}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        tools.append({"type": "function", "function": function})
    return tools, web_search


def _tool_choice(body: dict[str, Any], tools: list[dict[str, Any]]) -> dict[str, Any]:
    """tool_choice auto or none (any and tool force a tool: refused, as on the other
    endpoints), checked with or without tools; forwarded with a non-empty tool list."""
    choice = obj(body, "tool_choice")
    params: dict[str, Any] = {"tools": tools} if tools else {}
    if choice is None:
        return params
    kind = choice.get("type")
    if kind not in ("auto", "none", "any", "tool"):
        raise invalid("tool_choice", "tool_choice.type must be auto, any, tool or none.")
    chosen = tool_choice({"tool_choice": kind}, NO_FORCING)
    parallel = choice.get("disable_parallel_tool_use")
    if parallel is not None and not isinstance(parallel, bool):
        raise invalid("tool_choice", "disable_parallel_tool_use must be a boolean.")
    if tools:
        params["tool_choice"] = chosen
        if parallel is not None:
            params["parallel_tool_calls"] = not parallel
    return params


def _bad(message: str) -> GatewayError:
    return GatewayError("invalid_messages", message, param="messages")
