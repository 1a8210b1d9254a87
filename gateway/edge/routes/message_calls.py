"""POST /v1/messages and POST /v1/messages/count_tokens: Anthropic's Messages API.

``/v1/messages`` is the fourth row of the endpoint table (:data:`~gateway.calls.pipeline.MESSAGES`),
served through the same walk as chat completions: a translation to a chat call and back.
Claude Code's ``?beta=true`` query and the ``anthropic-version`` / ``anthropic-beta``
headers are accepted and not read. Errors on these paths are rendered in Anthropic's
dialect by the app's error handler (it looks at :data:`MESSAGES_PATH`).

``count_tokens`` answers the gateway's conservative estimate of the prompt (the one the
reservation counts), after authentication, the inference scope and the model check; it
counts in the key's request window and reserves nothing.
"""

from __future__ import annotations

from quart import Quart, Response

from gateway.calls.parse.anthropic_messages import parse_messages
from gateway.calls.pipeline import MESSAGES
from gateway.calls.policy import check_model
from gateway.edge.auth import admit_reader
from gateway.edge.http import json_response, read_json_object, runtime
from gateway.edge.routes.model_calls import run_chat_shaped, serve_call

#: the path prefix whose errors speak Anthropic's dialect
MESSAGES_PATH = "/v1/messages"


async def messages() -> Response:
    return await serve_call(MESSAGES, run_chat_shaped)


async def count_tokens() -> Response:
    rt = runtime()
    record = await admit_reader(rt, MESSAGES.scope)
    body = await read_json_object()
    call = parse_messages(body, record.caps.max_output_tokens, counting=True)
    check_model(rt.call_parts.policy, record, call.model, MESSAGES.model_kind)
    return json_response({"input_tokens": call.prompt_estimate()})


def register(app: Quart) -> None:
    app.add_url_rule(MESSAGES_PATH, "messages", messages, methods=["POST"])
    app.add_url_rule(
        f"{MESSAGES_PATH}/count_tokens", "count_tokens", count_tokens, methods=["POST"]
    )
