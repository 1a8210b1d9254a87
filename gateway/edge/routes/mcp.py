"""POST /mcp: the gateway as one MCP server (Streamable HTTP) over the operator's servers.

The route only speaks HTTP: authenticate (step 1, the uniform 401), the inference scope
(step 2), the body (bounded as every body), the JSON-RPC message
(:mod:`gateway.tools.protocol`), then the method: ``tools/call`` is the governed walk
(:mod:`gateway.tools.walk`), the others are reads that count in the key's request window
and take no in-flight slot. Answers are JSON (never an SSE stream: the gateway sends no
server-to-client messages); ``GET /mcp`` is the app's 405 (no server stream is offered),
``DELETE /mcp`` ends nothing (sessions live in their ids, not in a node).

A refusal raised anywhere on this path is rendered by the app's error handler as a
JSON-RPC error (:func:`mcp_refusal`) at the catalog's HTTP status; a protocol fault is
answered here at the status the MCP transport gives its code.
"""

from __future__ import annotations

from typing import Any

from quart import Quart, Response, request

from gateway.accounts.key_record import KeyRecord
from gateway.edge.auth import admit_request, authenticate, carry_rate_headers, require_scope
from gateway.edge.exchange import ExchangeReport
from gateway.edge.http import read_body, request_globals, request_id, runtime
from gateway.errors import GatewayError
from gateway.serving.runtime import Runtime
from gateway.tools import jsonrpc

#: the key scope /mcp takes (tools/call is an inference call)
SCOPE = "inference"

MCP_PATH = "/mcp"
_JSON = "application/json"


def mcp_refusal(error: GatewayError) -> bytes:
    """The body of a refusal on this path: a JSON-RPC error naming the request's id."""
    return jsonrpc.refusal(getattr(request_globals(), "jsonrpc_id", None), error)


def _fault(request_id: Any, code: int, text: str, data: Any, status: int) -> Response:
    body = jsonrpc.error(request_id, code, text, data)
    return Response(body, status=status, content_type=_JSON)


async def post_mcp() -> Response:
    rt = runtime()
    record = await authenticate(rt)
    await require_scope(rt, record, SCOPE)
    try:
        raw = await read_body()
    except GatewayError as refused:
        await admit_request(rt, record)  # counted in the key's request window
        if refused.code != "request_too_large":
            raise
        return _fault(None, -32600, refused.message or "The body is too large.", None, 413)
    parts = await rt.tools()
    # imported with the SDK by Runtime.start_tools before tools() answers: no import here
    from gateway.tools import protocol
    from gateway.tools.walk import call_tool

    headers = {name.lower(): value for name, value in request.headers.items()}
    try:
        message = protocol.read_message(raw, headers, record.fingerprint)
    except protocol.ProtocolFault as fault:
        await admit_request(rt, record)
        return _fault(fault.request_id, fault.code, fault.message, fault.data, fault.status)
    request_globals().jsonrpc_id = message.id
    if message.id is None:  # a notification: nothing to answer
        await admit_request(rt, record)
        return Response("", status=202)
    if message.method == "tools/call":
        tags = request.headers.get("X-Svc-Tags")
        report = ExchangeReport(rt.metrics)
        value = await call_tool(
            parts, record, request_id(), message.params, tags, report, carry_rate_headers
        )
    else:
        await admit_request(rt, record)
        value = await _read(rt, parts, record, message)
    answer_headers = {}
    if message.method == "initialize":
        answer_headers[protocol.SESSION_HEADER] = protocol.session_id(
            message.version, record.fingerprint
        )
    body = protocol.result(message, value)
    return Response(body, status=200, headers=answer_headers, content_type=_JSON)


async def _read(rt: Runtime, parts: Any, record: KeyRecord, message: Any) -> dict[str, Any]:
    """A method other than ``tools/call``: its result."""
    from gateway.tools import protocol  # imported already (see post_mcp)

    if message.method == "initialize":
        return protocol.initialized(message)
    if message.method == "server/discover":
        return protocol.discovered()
    if message.method == "tools/list":
        org = rt.orgs.get(record.org_id)
        return {"tools": await parts.catalog.listed(record, org, rt.clock.now())}
    return {}  # ping


async def delete_mcp() -> Response:
    """End a session: there is nothing to end (the session lives in its id)."""
    rt = runtime()
    await authenticate(rt)
    return Response("", status=200)


def register(app: Quart) -> None:
    app.add_url_rule(MCP_PATH, "mcp", post_mcp, methods=["POST"])
    app.add_url_rule(MCP_PATH, "mcp_end", delete_mcp, methods=["DELETE"])
