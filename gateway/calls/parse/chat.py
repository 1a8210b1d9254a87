"""POST /v1/chat/completions: the body rules of the spec, turned into a :class:`ChatCall`.

A top-level ``null`` is a field not sent (:func:`~gateway.calls.parse.fields.without_nulls`).
Precedence: the first failing check answers, in this order.

1. The body is a JSON object (invalid_request, param null).
2. Unknown top-level fields (unsupported_parameter), the first in body order.
3. ``model``: absent or null is validation_failed, any other non-string invalid_request.
4. ``messages`` (invalid_messages).
5. Non-empty ``connectors`` / ``hitl_approvals`` (connectors_require_user_session).
6. Parameters refused by value or presence (unsupported_parameter), in the spec's
   order: n, logprobs, top_logprobs, logit_bias, store, prediction, audio, modalities,
   tool_choice, functions, function_call; a wrong type on one of them is invalid_request.
7. The other fields' values (invalid_request): temperature, top_p, user, service_tier,
   stop, seed, stream, stream_options, response_format, tools, parallel_tool_calls,
   web_search_options, max_tokens, max_completion_tokens.
8. The output budget against the key's limit (max_tokens_exceeds_key_limit).

Capabilities are checked later, once the model is resolved (:func:`check_capabilities`).
"""

from __future__ import annotations

from typing import Any

from gateway.accounts.catalog import Model
from gateway.accounts.key_fields import as_int
from gateway.calls.parse import ChatCall
from gateway.calls.parse.fields import (
    COMMON_FIELDS,
    common_params,
    flag,
    forward_capabilities,
    invalid,
    obj,
    output_budget,
    positive_int,
    refuse_present,
    refuse_session_fields,
    refuse_unknown,
    require_model,
    require_object,
    tool_choice,
    tool_params,
    unsupported,
    without_nulls,
)
from gateway.errors import GatewayError

ROLES = ("system", "user", "assistant", "tool")
MAX_STOP = 4
STRUCTURED_FORMATS = ("json_object", "json_schema")
# What works instead of a forcing tool_choice (named in its refusal).
STRUCTURED_OUTPUT = "response_format with type json_schema"
# Refused whatever their value (a null is not sent): sending the field is the mistake.
REFUSED = ("top_logprobs", "prediction", "audio", "functions", "function_call")
#: the refusal of each capability a model lacks, in the order they are checked
CAPABILITY_CODES = {
    "vision": "model_lacks_vision",
    "tools": "model_lacks_tools",
    "structured_output": "model_lacks_structured_output",
    "web_search": "web_search_unavailable",
}
#: the field that asks for a capability, by endpoint (the need's own name otherwise)
CAPABILITY_PARAMS = {
    "chat": {"vision": "messages", "structured_output": "response_format",
             "web_search": "web_search_options"},
    "responses": {"vision": "input", "structured_output": "response_format",
                  "web_search": "tools"},
    "messages": {"vision": "messages", "structured_output": "output_config",
                 "web_search": "tools"},
}  # fmt: skip
CHAT_FIELDS = COMMON_FIELDS | {
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "seed",
    "stream_options",
    "response_format",
    "web_search_options",
    "n",
    "logprobs",
    "logit_bias",
    "modalities",
    *REFUSED,
}


def parse_chat(body: Any, max_output_tokens: int) -> ChatCall:
    """Validate a chat-completions body; ``max_output_tokens`` is the key's cap."""
    body = without_nulls(require_object(body))
    refuse_unknown(body, CHAT_FIELDS)
    model = require_model(body)
    messages = check_messages(body.get("messages"))
    refuse_session_fields(body)
    _refuse_unsupported(body)
    params = common_params(body)
    params.update(_stop_and_seed(body))
    stream = flag(body, "stream")
    stream_options = obj(body, "stream_options") or {}
    response_format = _response_format(body)
    tools = _tools(body)
    params.update(tool_params(body, tools, tool_choice(body, STRUCTURED_OUTPUT)))
    web_search = obj(body, "web_search_options")
    needs = forward_capabilities(params, messages, tools, response_format, web_search)
    # Both budgets sent: the smaller is the ceiling (the caller asked for at most that),
    # and each must fit the key's limit; the error param is max_tokens either way.
    budget = output_budget(
        (positive_int(body, "max_tokens"), positive_int(body, "max_completion_tokens")),
        max_output_tokens,
        "max_tokens",
    )
    return ChatCall(
        model,
        messages,
        budget,
        stream,
        include_usage=stream_options.get("include_usage") is True,
        params=params,
        needs=needs,
        endpoint="chat",
    )


def check_messages(value: Any) -> list[dict[str, Any]]:
    """A non-empty array of {role, content}; content is a string, a non-empty array of
    typed parts, or null (or absent) on an assistant message that carries tool_calls."""
    if not isinstance(value, list) or not value:
        raise _bad_messages("messages must be a non-empty array of objects.")
    for index, message in enumerate(value):
        if not isinstance(message, dict):
            raise _bad_messages(f"messages[{index}] must be an object.")
        role = message.get("role")
        if role not in ROLES:
            raise _bad_messages(
                f"messages[{index}].role must be one of system, user, assistant, tool."
            )
        if not _readable_content(message):
            raise _bad_messages(f"messages[{index}].content is missing or malformed.")
    return value


def check_capabilities(call: ChatCall, model: Model) -> None:
    """Refuse a call the resolved model cannot serve.

    An embedding model called on chat or responses is invalid_request with param model:
    the model exists and is allowed, the request just names the wrong kind of model.
    """
    if model.kind == "embedding":
        raise invalid("model", f"{model.id} is an embedding model; use /v1/embeddings.")
    for need, code in CAPABILITY_CODES.items():
        if need in call.needs and not model.has(need):
            raise GatewayError(code, param=capability_param(call, need))


def capability_param(call: ChatCall, need: str) -> str:
    """The field of the caller's body that asks for ``need``: the param of its refusals."""
    return CAPABILITY_PARAMS[call.endpoint].get(need, need)


def _readable_content(message: dict[str, Any]) -> bool:
    content = message.get("content")
    if isinstance(content, str):
        return True
    if isinstance(content, list):
        return bool(content) and all(
            isinstance(part, dict) and isinstance(part.get("type"), str) for part in content
        )
    # an assistant turn may hold only tool calls, or only a refusal (a model's earlier
    # answer sent back as it came)
    calls = message.get("tool_calls")
    return (
        content is None
        and message["role"] == "assistant"
        and ((isinstance(calls, list) and bool(calls)) or isinstance(message.get("refusal"), str))
    )


def _bad_messages(message: str) -> GatewayError:
    return GatewayError("invalid_messages", message, param="messages")


def _refuse_unsupported(body: dict[str, Any]) -> None:
    sent = body.get("n")
    if sent is not None:
        n = as_int(sent)
        if n is None or n < 1:
            raise invalid("n", "n must be a positive integer.")
        if n > 1:
            raise unsupported("n", "Only n=1 is supported.")
    flag(body, "logprobs", refused=True)
    refuse_present(body, ("top_logprobs",))
    if body.get("logit_bias") not in (None, {}):
        raise unsupported("logit_bias")
    flag(body, "store", refused=True)
    refuse_present(body, ("prediction", "audio"))
    if body.get("modalities") not in (None, ["text"]):
        raise unsupported("modalities", "Only text output is supported.")
    tool_choice(body, STRUCTURED_OUTPUT)
    refuse_present(body, ("functions", "function_call"))


def _stop_and_seed(body: dict[str, Any]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    stop = body.get("stop")
    if stop is not None:
        valid_list = isinstance(stop, list) and all(isinstance(item, str) for item in stop)
        if not (isinstance(stop, str) or valid_list):
            raise invalid("stop", "stop must be a string or an array of strings.")
        if valid_list and len(stop) > MAX_STOP:
            raise invalid("stop", f"At most {MAX_STOP} stop sequences are allowed.")
        params["stop"] = stop
    if body.get("seed") is not None:
        seed = as_int(body["seed"])
        if seed is None:
            raise invalid("seed", "seed must be an integer of at most 64 bits.")
        params["seed"] = seed
    return params


def _response_format(body: dict[str, Any]) -> dict[str, Any] | None:
    """text (the default, dropped), json_object or json_schema. A json_schema needs the
    object ``json_schema`` with a string ``name`` and, if sent, an object ``schema``: the
    rule /v1/responses applies to ``text.format`` (where the schema is required)."""
    value = obj(body, "response_format")
    if value is None or value.get("type") == "text":
        return None
    if value.get("type") not in STRUCTURED_FORMATS:
        raise invalid(
            "response_format", "response_format.type must be text, json_object or json_schema."
        )
    if value["type"] == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if (
            not isinstance(spec, dict)
            or not isinstance(spec.get("name"), str)
            or not isinstance(schema, dict | None)
        ):
            raise invalid(
                "response_format",
                "response_format.json_schema must be an object with a string name "
                "and, if sent, an object schema.",
            )
    return value


def _tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    tools = body.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise invalid("tools", "tools must be an array of objects.")
    return tools
