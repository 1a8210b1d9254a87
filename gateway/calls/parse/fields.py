"""Field checks shared by the chat-completions and responses parsers.

Conventions, the same for every field:

- A top-level JSON ``null`` is a field not sent (:func:`without_nulls`), on every field,
  known or not, refused on presence or not: some wrappers send ``null`` for every
  argument left out, and a null asks for nothing. Nested nulls keep their meaning.
- Booleans are not numbers: ``true`` is neither an integer nor a temperature.
- Wrong type or out-of-range value: 400 ``invalid_request`` with ``param`` naming the field.
  A known value the service does not serve: 400 ``unsupported_parameter``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeGuard

from gateway.accounts.key_fields import as_int
from gateway.errors import GatewayError

# Known fields whose non-empty value needs a user session (both endpoints).
SESSION_FIELDS = ("connectors", "hitl_approvals")
# Accepted on both endpoints; tags (metadata, svc_tags) are read by the tag step.
COMMON_FIELDS = frozenset(
    {
        "model",
        "temperature",
        "top_p",
        "stream",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "user",
        "service_tier",
        "metadata",
        "svc_tags",
        "store",
        "top_logprobs",
        *SESSION_FIELDS,
    }
)
# Image content parts, in chat (image_url) and responses (input_image) terms.
IMAGE_PARTS = ("image_url", "input_image")
#: sampling numbers forwarded on both endpoints, each from 0 to its bound (both included)
SAMPLING = {"temperature": 2, "top_p": 1}


def is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def invalid(param: str, message: str) -> GatewayError:
    return GatewayError("invalid_request", message, param=param)


def unsupported(param: str, message: str | None = None) -> GatewayError:
    return GatewayError(
        "unsupported_parameter",
        message or f"The parameter {param} is not supported by this gateway.",
        param=param,
    )


def require_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise GatewayError("invalid_request", "The request body must be a JSON object.")
    return body


def without_nulls(body: dict[str, Any]) -> dict[str, Any]:
    """The body without its top-level nulls: a null field is a field not sent."""
    return {name: value for name, value in body.items() if value is not None}


def refuse_unknown(body: dict[str, Any], known: frozenset[str]) -> None:
    """Any top-level field the endpoint does not know, the first in body order (many are
    real OpenAI fields, such as presence_penalty: the message says not supported here)."""
    for name in body:
        if name not in known:
            raise unsupported(
                name,
                f"The parameter {name} is not supported by this gateway; the fields it knows:"
                f" {', '.join(sorted(known))} (some only with certain values).",
            )


def require_model(body: dict[str, Any], missing: str = "validation_failed") -> str:
    """``model``: absent (or null) is ``missing`` (the spec's validation_failed is for chat
    completions only; elsewhere a missing field is invalid_request); anything but a
    non-empty string is invalid_request."""
    model = body.get("model")
    if model is None:
        raise GatewayError(missing, "model is required.", param="model")
    if not isinstance(model, str) or not model:
        raise invalid("model", "model must be a non-empty string.")
    return model


def refuse_session_fields(body: dict[str, Any]) -> None:
    """Non-empty connectors or hitl_approvals; empty ones (null, [], {}, "") are accepted."""
    for name in SESSION_FIELDS:
        if body.get(name):
            raise GatewayError(
                "connectors_require_user_session",
                f"{name} requires a user session; API keys cannot use it.",
                param=name,
            )


def refuse_present(body: dict[str, Any], names: Iterable[str]) -> None:
    """Fields refused whatever their (non-null) value."""
    for name in names:
        if name in body:
            raise unsupported(name)


def flag(body: dict[str, Any], name: str, refused: bool | None = None) -> bool:
    """A boolean field (absent: false); ``refused`` is the value that is unsupported."""
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid(name, f"{name} must be a boolean.")
    if refused is not None and value is refused:
        raise unsupported(name, f"{name}={str(value).lower()} is not supported.")
    return value


def number(body: dict[str, Any], name: str, high: float) -> float | None:
    """A number between 0 and ``high``, both included."""
    value = body.get(name)
    if value is None:
        return None
    if not is_number(value) or not 0 <= value <= high:
        raise invalid(name, f"{name} must be a number from 0 to {high:g}.")
    return value


def positive_int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    whole = as_int(value)
    if whole is None or whole < 1:
        raise invalid(name, f"{name} must be a positive integer.")
    return whole


def string(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise invalid(name, f"{name} must be a string.")
    return value


def obj(body: dict[str, Any], name: str) -> dict[str, Any] | None:
    value = body.get(name)
    if value is not None and not isinstance(value, dict):
        raise invalid(name, f"{name} must be an object.")
    return value


def tool_choice(body: dict[str, Any], structured: str) -> str | None:
    """Only auto and none: anything else (required, a named tool) forces a tool.

    Structured-output libraries force a tool by default; the refusal names what works
    instead: ``structured`` (the endpoint's json_schema output) or tool_choice auto.
    """
    value = body.get("tool_choice")
    if value is None or value in ("auto", "none"):
        return value
    raise unsupported(
        "tool_choice",
        "This gateway cannot force a tool call: only tool_choice auto or none is "
        f"supported. For structured output use {structured}; to let the model call a "
        "tool, send tool_choice auto.",
    )


def common_params(body: dict[str, Any]) -> dict[str, Any]:
    """temperature and top_p (forwarded); user and service_tier checked, never forwarded
    ("accepted, no effect"): a caller can neither change the upstream's price tier nor
    hand the upstream an end-user id."""
    found = {name: number(body, name, high) for name, high in SAMPLING.items()}
    string(body, "user")
    string(body, "service_tier")
    return {name: value for name, value in found.items() if value is not None}


def tool_params(
    body: dict[str, Any], tools: list[dict[str, Any]], choice: str | None
) -> dict[str, Any]:
    """tools, tool_choice and parallel_tool_calls, forwarded only with a non-empty tool
    list (OpenAI refuses the last two without tools, and an empty list)."""
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise invalid("parallel_tool_calls", "parallel_tool_calls must be a boolean.")
    if not tools:
        return {}
    params: dict[str, Any] = {"tools": tools}
    if choice is not None:
        params["tool_choice"] = choice
    if parallel is not None:
        params["parallel_tool_calls"] = parallel
    return params


def output_budget(sent: Iterable[int | None], limit: int, param: str) -> int:
    """The effective output ceiling: the smallest budget sent, else the key's limit.

    Every budget sent must fit the limit; the error names ``param`` whichever was sent.
    """
    budgets = [value for value in sent if value is not None]
    if any(value > limit for value in budgets):
        raise GatewayError(
            "max_tokens_exceeds_key_limit",
            f"The output budget is above this key's limit of {limit} tokens.",
            param=param,
        )
    return min(budgets, default=limit)


def forward_capabilities(
    params: dict[str, Any],
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    response_format: dict[str, Any] | None,
    web_search: dict[str, Any] | None,
) -> frozenset[str]:
    """Forward a structured-output format and web search options in ``params`` (chat
    names); the capabilities the call needs of its model."""
    needs: set[str] = set()
    if response_format is not None:
        params["response_format"] = response_format
        needs.add("structured_output")
    if web_search is not None:
        params["web_search_options"] = web_search
        needs.add("web_search")
    if tools:
        needs.add("tools")
    if has_image(messages):
        needs.add("vision")
    return frozenset(needs)


def has_image(messages: list[dict[str, Any]]) -> bool:
    return any(
        isinstance(part, dict) and part.get("type") in IMAGE_PARTS
        for message in messages
        if isinstance(message.get("content"), list)
        for part in message["content"]
    )
