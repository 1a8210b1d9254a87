"""JSON-RPC error answers of ``/mcp``, without the MCP SDK (the app renders refusals with
them before the SDK is imported: see :meth:`gateway.serving.runtime.Runtime.start_tools`)."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import GatewayError

#: the JSON-RPC code of a gateway refusal (implementation-defined server error range)
GATEWAY_REFUSED = -32080


def error(request_id: Any, code: int, text: str, data: Any = None) -> bytes:
    fault: dict[str, Any] = {"code": code, "message": text}
    if data is not None:
        fault["data"] = data
    return orjson.dumps({"jsonrpc": "2.0", "id": request_id, "error": fault})


def refusal(request_id: Any, refused: GatewayError) -> bytes:
    """A gateway refusal: ``data`` is the error object of the model-call endpoints
    (``code``, ``type``, ``message``, ``param``; ``svc`` and ``retry_after`` when given)."""
    body = refused.body()
    data = dict(body["error"])
    if "svc" in body:
        data["svc"] = body["svc"]
    retry_after = refused.retry_after or refused.spec.retry_after
    if retry_after is not None:
        data["retry_after"] = retry_after
    return error(request_id, GATEWAY_REFUSED, str(data["message"]), data)
