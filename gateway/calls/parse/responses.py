"""POST /v1/responses: the body rules of the spec, translated into a chat :class:`ChatCall`.

The endpoint is served by chat completions, so the call carries chat names: ``input``
and ``instructions`` become ``messages``, ``max_output_tokens`` the ``max_tokens``
ceiling, ``text.format`` the ``response_format``, function tools chat tools and a
``web_search`` tool ``web_search_options``. The answer is translated back by
:mod:`gateway.calls.parse.translate` (re-exported here).

A top-level ``null`` is a field not sent (:func:`~gateway.calls.parse.fields.without_nulls`).
Precedence: the first failing check answers, in this order.

1. The body is a JSON object (invalid_request, param null).
2. Unknown top-level fields (unsupported_parameter), the first in body order.
3. ``model``: absent, null or not a non-empty string is invalid_request (the spec's
   validation_failed is for chat completions only).
4. ``input`` (invalid_input; item_reference, input_file and file-id images are
   unsupported_parameter with param input).
5. Non-empty ``connectors`` / ``hitl_approvals`` (connectors_require_user_session).
6. Parameters refused by value or presence (unsupported_parameter): previous_response_id,
   top_logprobs, stream_options (any value), store true, background true, truncation
   auto, tool_choice other than auto or none; a wrong type is invalid_request.
7. The other fields' values (invalid_request): temperature, top_p, user, service_tier,
   instructions, stream, reasoning, text (its format: param response_format), tools
   (types other than function and web_search: unsupported_parameter),
   parallel_tool_calls, max_output_tokens.
8. The output budget against the key's limit (max_tokens_exceeds_key_limit, param
   max_output_tokens).
"""

from __future__ import annotations

from typing import Any

from gateway.calls.parse import ChatCall, fields
from gateway.calls.parse.translate import ResponseStreamTranslator, chat_to_response
from gateway.errors import GatewayError

__all__ = ["ResponseStreamTranslator", "chat_to_response", "parse_responses"]

# Refused whatever their value (a null is not sent).
REFUSED = ("previous_response_id", "top_logprobs", "stream_options")
RESPONSES_FIELDS = fields.COMMON_FIELDS | {
    "input",
    "instructions",
    "max_output_tokens",
    "text",
    "reasoning",
    "include",
    "truncation",
    "background",
    *REFUSED,
}
# Message roles of input items; developer is the responses name of system.
INPUT_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PARTS = ("input_text", "output_text")
UNSUPPORTED_INPUTS = ("item_reference", "input_file")
# What works instead of a forcing tool_choice (named in its refusal).
STRUCTURED_OUTPUT = "text.format with type json_schema"


def parse_responses(body: Any, max_output_tokens: int) -> ChatCall:
    """Validate a responses body; ``max_output_tokens`` is the key's cap."""
    body = fields.without_nulls(fields.require_object(body))
    fields.refuse_unknown(body, RESPONSES_FIELDS)
    model = fields.require_model(body, missing="invalid_request")
    messages = input_messages(body.get("input"))
    fields.refuse_session_fields(body)
    fields.refuse_present(body, REFUSED)
    fields.flag(body, "store", refused=True)
    fields.flag(body, "background", refused=True)
    truncation = body.get("truncation")
    if truncation == "auto":
        raise fields.unsupported("truncation", "truncation auto is not supported.")
    if truncation not in (None, "disabled"):
        raise fields.invalid("truncation", "truncation must be auto or disabled.")
    _include(body.get("include"))
    choice = fields.tool_choice(body, STRUCTURED_OUTPUT)
    params = fields.common_params(body)
    instructions = fields.string(body, "instructions")
    if instructions is not None:
        messages.insert(0, {"role": "system", "content": instructions})
    stream = fields.flag(body, "stream")
    fields.obj(body, "reasoning")  # accepted, not forwarded: nested members are not ours to check
    response_format = _text_format(body)
    tools, web_search = _tools(body.get("tools"))
    params.update(fields.tool_params(body, tools, choice))
    needs = fields.forward_capabilities(params, messages, tools, response_format, web_search)
    budget = fields.output_budget(
        (fields.positive_int(body, "max_output_tokens"),), max_output_tokens, "max_output_tokens"
    )
    return ChatCall(
        model, messages, budget, stream, params=params, needs=needs, endpoint="responses"
    )


def _include(value: Any) -> None:
    """``include`` names extra data of output items. Items this service never produces
    (encrypted reasoning, search sources, file search results, ...) are accepted with no
    effect, as SDKs send some by default; logprobs of the output text are refused like
    ``top_logprobs``, since the answer would silently lack them."""
    if value is None:
        return
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise fields.invalid("include", "include must be an array of strings.")
    if "message.output_text.logprobs" in value:
        raise fields.unsupported(
            "include", "include message.output_text.logprobs is not supported."
        )


def input_messages(value: Any) -> list[dict[str, Any]]:
    """Chat messages of ``input``: a string (one user message) or an array of items —
    messages, function_call and function_call_output items."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise _unreadable("input must be a string or a non-empty array of items.")
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            raise _unreadable(f"input[{index}] must be an object.")
        kind = item.get("type", "message")
        if kind in UNSUPPORTED_INPUTS:
            raise fields.unsupported("input", f"{kind} inputs are not supported.")
        if kind == "message":
            messages.append(_message(item, index))
        elif kind == "function_call":
            _append_tool_call(messages, item, index)
        elif kind == "function_call_output":
            output = item.get("output")
            content = output if isinstance(output, str) else _parts(output, index)
            call_id = _text_of(item, "call_id", index)
            messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
        else:
            raise _unreadable(f"input[{index}] has an unreadable type {kind!r}.")
    return messages


def _message(item: dict[str, Any], index: int) -> dict[str, Any]:
    role = item.get("role")
    if not isinstance(role, str) or role not in INPUT_ROLES:  # a list is no key of a dict
        raise _unreadable(f"input[{index}].role must be user, assistant, system or developer.")
    content = item.get("content")
    if not isinstance(content, str):
        content = _parts(content, index)
    return {"role": INPUT_ROLES[role], "content": content}


def _parts(value: Any, index: int) -> list[dict[str, Any]]:
    """Responses content parts as chat content parts."""
    if not isinstance(value, list) or not value:
        raise _unreadable(f"input[{index}].content must be a string or an array of parts.")
    parts: list[dict[str, Any]] = []
    for part in value:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in UNSUPPORTED_INPUTS:
            raise fields.unsupported("input", f"{kind} inputs are not supported.")
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            # an earlier answer sent back: what the assistant said, as text
            parts.append({"type": "text", "text": part["refusal"]})
        elif kind == "input_image":
            parts.append(_image(part))
        else:
            raise _unreadable(f"input[{index}] holds an unreadable content part.")
    return parts


def _image(part: dict[str, Any]) -> dict[str, Any]:
    url = part.get("image_url")
    if not isinstance(url, str):
        raise fields.unsupported(
            "input", "input_image needs image_url; file ids are not supported."
        )
    image: dict[str, Any] = {"url": url}
    if isinstance(part.get("detail"), str):
        image["detail"] = part["detail"]
    return {"type": "image_url", "image_url": image}


def _append_tool_call(messages: list[dict[str, Any]], item: dict[str, Any], index: int) -> None:
    """A function_call item joins the assistant message before it (chat carries the text
    and the tool calls of one turn in one message)."""
    call = {
        "id": _text_of(item, "call_id", index),
        "type": "function",
        "function": {
            "name": _text_of(item, "name", index),
            "arguments": _text_of(item, "arguments", index),
        },
    }
    if messages and messages[-1]["role"] == "assistant":
        messages[-1].setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _text_of(item: dict[str, Any], name: str, index: int) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise _unreadable(f"input[{index}].{name} must be a string.")
    return value


def _unreadable(message: str) -> GatewayError:
    return GatewayError("invalid_input", message, param="input")


def _text_format(body: dict[str, Any]) -> dict[str, Any] | None:
    """``text.format`` as a chat response_format (errors name response_format); type
    text is the default and means none. text.verbosity and unknown members are ignored."""
    text = fields.obj(body, "text") or {}
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if (
        kind == "json_schema"
        and isinstance(fmt.get("name"), str)
        and isinstance(fmt.get("schema"), dict)
    ):
        keep = ("name", "schema", "description", "strict")
        return {"type": "json_schema", "json_schema": {k: fmt[k] for k in keep if k in fmt}}
    raise fields.invalid(
        "response_format",
        "text.format must be text, json_object, or json_schema with a name and a schema.",
    )


def _tools(value: Any) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Function tools as chat tools, and the web_search tool as web_search_options."""
    if value is None:
        return [], None
    if not isinstance(value, list) or not all(isinstance(tool, dict) for tool in value):
        raise fields.invalid("tools", "tools must be an array of objects.")
    tools: list[dict[str, Any]] = []
    web_search: dict[str, Any] | None = None
    for tool in value:
        kind = tool.get("type")
        if kind == "function":
            if not isinstance(tool.get("name"), str):
                raise fields.invalid("tools", "A function tool needs a name.")
            keep = ("name", "description", "parameters", "strict")
            tools.append({"type": "function", "function": {k: tool[k] for k in keep if k in tool}})
        elif kind == "web_search":
            web_search = _web_search_options(tool)
        else:
            raise fields.unsupported("tools", "Only function and web_search tools are supported.")
    return tools, web_search


def _web_search_options(tool: dict[str, Any]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if "search_context_size" in tool:
        options["search_context_size"] = tool["search_context_size"]
    location = tool.get("user_location")
    if isinstance(location, dict):
        fields = ("city", "country", "region", "timezone")
        approximate = {k: location[k] for k in fields if k in location}
        options["user_location"] = {"type": "approximate", "approximate": approximate}
    return options
