"""POST /v1/chat/completions and POST /v1/responses: the model-call walk of DESIGN.md.

Both endpoints share one path: the responses body is translated to a chat call, served,
and its answer translated back, which is why svc.ignored_parameters uses chat names on
both endpoints.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import trio
from quart import Quart, Response, request

from gateway import idempotency
from gateway.admission import admit
from gateway.auth import authenticate, require_scope
from gateway.calls import ChatCall
from gateway.calls.chat import check_capabilities, parse_chat
from gateway.calls.responses import ResponseStreamTranslator, chat_to_response, parse_responses
from gateway.calls.tags import collect_tags
from gateway.errors import GatewayError
from gateway.estimate import estimate_prompt_tokens
from gateway.http import json_response, read_json_object, request_id, runtime
from gateway.keys import KeyRecord
from gateway.pipeline import (
    Call,
    open_call,
    provider_request,
    remaining,
    reserve_call,
    resolve,
    svc_block,
)
from gateway.policy import check_entitlements, check_web_search
from gateway.provider_errors import map_provider_error
from gateway.providers.base import ProviderError
from gateway.settlement import Ending
from gateway.streaming import ChatFormat, ResponsesFormat, start_stream

Parser = Callable[[dict[str, Any], int], ChatCall]


async def _serve(endpoint: str, parse: Parser) -> Response:
    record = authenticate()
    await require_scope(record, "inference")
    try:
        idem_key = idempotency.header_value()
        # the whole body is read before step 3 takes an in-flight slot: a client that
        # never finishes sending holds its connection, never a slot of its key
        body = await read_json_object()
    except GatewayError:
        # a malformed header or body is a refused request like any other: it counts in
        # the key's request window (and may be its 429), though no call follows
        await admit(record, take_slot=False)
        raise
    if idem_key is None:
        return await _call(record, endpoint, parse)
    run = partial(_call, record, endpoint, parse)
    return await idempotency.serve(record, endpoint, idem_key, body, run)


async def _call(record: KeyRecord, endpoint: str, parse: Parser) -> Response:
    """Steps 3 onwards: admit with an in-flight slot, walk, and always finish the call."""
    call = await open_call(runtime(), record, request_id(), endpoint)
    try:
        return await _walk(call, parse)
    except Exception as exc:
        if not call.handed_off and not isinstance(exc, GatewayError):
            # a fault of ours (answered 500 internal_error): the record must not say 200
            await call.finish(_ending(call), http_status=500, error_code="internal_error")
        raise
    finally:
        if not call.handed_off:
            await call.finish(_ending(call))


def _ending(call: Call) -> Ending:
    """How a call that ended without its own settlement row settles."""
    return Ending.OTHER if call.provider_called else Ending.NOT_CALLED


async def _walk(call: Call, parse: Parser) -> Response:
    record = call.record
    body = await read_json_object()
    call.tags = collect_tags(
        request.headers.get("X-Svc-Tags"), body, record.default_tags, record.required_tags
    )
    chat = parse(body, record.caps.max_output_tokens)
    call.stream = chat.stream
    features = ["chat_completions" if call.endpoint == "chat" else "responses"]
    features += ["streaming"] * chat.stream + sorted(chat.needs)
    check_entitlements(call.runtime, record, features)
    model = resolve(call, chat.model, "chat")
    check_capabilities(chat, model)
    if "web_search" in chat.needs:
        param = "web_search_options" if call.endpoint == "chat" else "tools"
        check_web_search(call.runtime, record, model, param)
    upstream = {"messages": chat.messages, "max_tokens": chat.max_tokens, **chat.params}
    if chat.stream:
        upstream["stream"] = True
        upstream["stream_options"] = {"include_usage": True}
    await reserve_call(call, estimate_prompt_tokens(upstream), chat.max_tokens)
    preq = provider_request(call, upstream)
    assert call.provider is not None
    ignored = call.provider.ignored_parameters(upstream)
    if chat.stream:
        fmt = (
            ChatFormat(model.id, chat.include_usage, svc_block(call, ignored))
            if call.endpoint == "chat"
            else ResponsesFormat(
                ResponseStreamTranslator(
                    chat,
                    response_id(call),
                    created_at=int(call.runtime.clock.now()),
                    svc=svc_block(call, ignored),
                )
            )
        )
        return await start_stream(call, preq, fmt)
    call.calling_provider()
    try:
        with trio.move_on_after(remaining(call)) as scope:
            result = await call.provider.complete(preq)
    except ProviderError as exc:
        error, ending = map_provider_error(exc, byok=record.byok)
        await call.finish(ending, usage=exc.usage, http_status=error.status, error_code=error.code)
        raise error from None
    if scope.cancelled_caught:
        await call.finish(Ending.OTHER, http_status=504, error_code="request_timeout")
        raise GatewayError("request_timeout", "The call ran out of time; retry with stream true.")
    ending = Ending.USAGE if result.usage else Ending.OTHER
    completion = {**result.completion, "model": model.id}
    try:
        if call.endpoint == "responses":
            answer = chat_to_response(completion, chat, response_id(call))
        else:
            answer = completion
        answer["svc"] = svc_block(call, ignored)
        body = json_response(answer)
    except Exception:
        # a fault of ours with the answer in hand: settled as the provider's answer
        # says, recorded as the 500 the client gets
        await call.finish(ending, usage=result.usage, http_status=500, error_code="internal_error")
        raise
    await call.finish(ending, usage=result.usage)
    return body


def response_id(call: Call) -> str:
    """The Responses API id of a call: its request id under the resp_ prefix."""
    return "resp_" + call.request_id.removeprefix("req_")


async def chat_completions() -> Response:
    return await _serve("chat", parse_chat)


async def responses() -> Response:
    return await _serve("responses", parse_responses)


def register(app: Quart) -> None:
    app.add_url_rule("/v1/chat/completions", "chat", chat_completions, methods=["POST"])
    app.add_url_rule("/v1/responses", "responses", responses, methods=["POST"])
