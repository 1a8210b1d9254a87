"""POST /v1/messages and POST /v1/messages/count_tokens: Anthropic's Messages API.

``/v1/messages`` is the fourth row of the endpoint table (:data:`~gateway.calls.pipeline.MESSAGES`),
served through the same walk as chat completions: passed through to an ``anthropic``
deployment, a translation to a chat call and back for the other kinds. Claude Code's
``?beta=true`` query and the ``anthropic-version`` header are accepted and not read; the
``anthropic-beta`` values are forwarded on a passthrough (a translation has no use for
them). Errors on these paths are rendered in Anthropic's
dialect by the app's error handler (it looks at :data:`MESSAGES_PATH`).

``count_tokens`` answers, after authentication, the inference scope and the model check
(it counts in the key's request window and reserves nothing): for a live key on a model
whose first deployment speaks the Messages API (``anthropic``), the upstream's own count
(:mod:`gateway.calls.counting`); otherwise, or when the upstream fails or is
slow, the gateway's bound of the prompt with the model's ``tokenizer`` (the one a
reservation counts: exact for o200k and cl100k models, the byte bound else).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from quart import Quart, Response, request

from gateway.calls.counting import count_input_tokens
from gateway.calls.lifecycle import Call
from gateway.calls.parse import ChatCall
from gateway.calls.parse.anthropic_messages import parse_messages
from gateway.calls.pipeline import MESSAGES, Endpoint
from gateway.calls.policy import check_model
from gateway.edge.auth import admit_reader
from gateway.edge.http import json_response, read_json_object, runtime
from gateway.edge.routes.model_calls import run_chat_shaped, serve_call

#: the path prefix whose errors speak Anthropic's dialect
MESSAGES_PATH = "/v1/messages"


async def messages() -> Response:
    return await serve_call(MESSAGES, _with_betas)


async def _with_betas(call: Call, endpoint: Endpoint, chat: Any) -> Response:
    """The call, with the ``anthropic-beta`` values to forward on a passthrough."""
    betas = beta_values(request.headers.getlist("anthropic-beta"))
    if betas and isinstance(chat, ChatCall) and chat.native is not None:
        chat = replace(chat, native=replace(chat.native, betas=betas))
    return await run_chat_shaped(call, endpoint, chat)


def beta_values(headers: list[str]) -> tuple[str, ...]:
    """The betas of ``anthropic-beta`` headers (comma-separated values, one header or
    several), in order, each once."""
    values = (value.strip() for header in headers for value in header.split(","))
    return tuple(dict.fromkeys(value for value in values if value))


async def count_tokens() -> Response:
    rt = runtime()
    record = await admit_reader(rt, MESSAGES.scope)
    body = await read_json_object()
    call = parse_messages(body, record.caps.max_output_tokens, counting=True)
    parts = rt.call_parts
    model = check_model(parts.policy, record, call.model, MESSAGES.model_kind)
    betas = beta_values(request.headers.getlist("anthropic-beta"))
    counted = await count_input_tokens(parts, record, model, call, betas)
    return json_response({"input_tokens": counted})


def register(app: Quart) -> None:
    app.add_url_rule(MESSAGES_PATH, "messages", messages, methods=["POST"])
    app.add_url_rule(
        f"{MESSAGES_PATH}/count_tokens", "count_tokens", count_tokens, methods=["POST"]
    )
