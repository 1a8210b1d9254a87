"""POST /v1/chat/completions and POST /v1/responses, and the HTTP side of every model call.

A route only speaks HTTP: authenticate, check the scope, read the body (and the
Idempotency-Key), hand them to :mod:`gateway.calls.pipeline`, answer. Both inference endpoints
share one path: the responses body is translated to a chat call, served, and its answer
translated back, which is why svc.ignored_parameters uses chat names on both endpoints.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from quart import Quart, Response, g, request

from gateway.accounts.key_record import KeyRecord
from gateway.calls import pipeline
from gateway.calls.lifecycle import Call
from gateway.calls.parse import tags
from gateway.calls.pipeline import CHAT, RESPONSES, Endpoint
from gateway.edge import idempotency
from gateway.edge.auth import admit_request, authenticate, carry_rate_headers, require_scope
from gateway.edge.exchange import ExchangeReport
from gateway.edge.http import call_answer, read_json_object, request_id, runtime
from gateway.errors import GatewayError
from gateway.serving.runtime import Runtime
from gateway.store.claims import Claim

#: what a route does with a prepared call: call the provider, answer
Run = Callable[[Call, Endpoint, Any], Awaitable[Response]]


async def serve_call(endpoint: Endpoint, run: Run) -> Response:
    rt = runtime()
    record = await authenticate(rt)
    await require_scope(rt, record, endpoint.scope)
    try:
        idem_key = idempotency.header_value() if endpoint.idempotent else None
        if idem_key is not None:
            # a repeat is answered before the tags are read (step 4): a malformed header
            # is refused all the same, as the document says (issue 50: a replay took it)
            tags.parse_header(request.headers.get(tags.HEADER))
        # the whole body is read before step 3 takes an in-flight slot: a client that
        # never finishes sending holds its connection, never a slot of its key
        body = await read_json_object()
    except GatewayError:
        # a malformed header or body is a refused request like any other: it counts in
        # the key's request window (and may be its 429), though no call follows
        await admit_request(rt, record)
        raise
    call = partial(_call, rt, endpoint, run, record, body)
    if idem_key is None:
        return await call(None)
    return await idempotency.serve(rt, record, endpoint.name, idem_key, body, call)


async def _call(
    rt: Runtime,
    endpoint: Endpoint,
    run: Run,
    record: KeyRecord,
    body: dict[str, Any],
    claim: Claim | None,
) -> Response:
    report = ExchangeReport(rt.metrics)
    async with pipeline.open_call(
        rt.call_parts, record, request_id(), endpoint, claim, report
    ) as call:
        carry_rate_headers(call.admission)
        g.rate_headers["X-Svc-Cache"] = "bypass"  # a refusal before the cache looked
        headers = request.headers
        parsed = await pipeline.prepare(
            call, endpoint, body, headers.get("X-Svc-Tags"), headers.get("Cache-Control")
        )
        g.rate_headers["X-Svc-Cache"] = call.cache.result if call.cache else "bypass"
        return await run(call, endpoint, parsed)


async def run_chat_shaped(call: Call, endpoint: Endpoint, chat: Any) -> Response:
    if chat.stream:
        events = await pipeline.stream(call, endpoint, chat)
        return Response(
            events.body, status=200, headers=events.headers, content_type="text/event-stream"
        )
    return call_answer(await pipeline.complete(call, endpoint, chat))


async def chat_completions() -> Response:
    return await serve_call(CHAT, run_chat_shaped)


async def responses() -> Response:
    return await serve_call(RESPONSES, run_chat_shaped)


def register(app: Quart) -> None:
    app.add_url_rule("/v1/chat/completions", "chat", chat_completions, methods=["POST"])
    app.add_url_rule("/v1/responses", "responses", responses, methods=["POST"])
