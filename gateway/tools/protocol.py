"""The MCP wire at ``/mcp``: JSON-RPC over Streamable HTTP, two revisions, no state kept.

    revision     how a request says which it is           what a node must know
    ----------   --------------------------------------   ----------------------------------
    2025-11-25   ``initialize`` first; then the            nothing: the ``Mcp-Session-Id``
                 ``Mcp-Session-Id`` the gateway gave       carries the revision, bound to
                 (and ``MCP-Protocol-Version``)            the key that opened it (HMAC)
    2026-07-28   each request: ``_meta`` and the           nothing: every request is whole
                 ``MCP-Protocol-Version``, ``Mcp-Method``,
                 ``Mcp-Name`` headers, which must match

So any worker of any node serves any request (no sticky sessions). The envelope checks of
2026-07-28 are the SDK's (:func:`mcp.shared.inbound.classify_inbound_request`), params and
results are validated against the revision's schema by the SDK's tables
(:mod:`mcp_types.methods`). A fault of the message is a :class:`ProtocolFault` (JSON-RPC
-32700, -32600, -32601, -32602, the SDK's header and version codes); a refusal of the
gateway is a JSON-RPC error whose ``data`` is the error object of the model-call
endpoints (:func:`gateway.tools.jsonrpc.refusal`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from mcp.shared.inbound import (
    ERROR_CODE_HTTP_STATUS,
    MCP_PROTOCOL_VERSION_HEADER,
    InboundLadderRejection,
    classify_inbound_request,
)
from mcp_types import PROTOCOL_VERSION_META_KEY, SERVER_INFO_META_KEY
from mcp_types import methods as wire_methods
from mcp_types.jsonrpc import INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from gateway import __version__

SESSION_HEADER = "Mcp-Session-Id"
#: the revision a request without a session or a version header speaks (the spec's rule)
DEFAULT_HANDSHAKE_VERSION = "2025-03-26"
LATEST_HANDSHAKE = "2025-11-25"
SERVER_INFO = {"name": "svc-gateway", "version": __version__}
INSTRUCTIONS = (
    "Tools of the organisation's MCP servers, named server__tool, under the key's limits."
)
#: the methods served: the rest are -32601 (no prompts, resources or completions)
SERVED = frozenset({"initialize", "ping", "tools/list", "tools/call", "server/discover"})


class ProtocolFault(Exception):
    """A message the protocol refuses: its JSON-RPC error and the HTTP status to send."""

    def __init__(
        self, code: int, message: str, request_id: Any = None, data: Any = None, status: int = 0
    ) -> None:
        super().__init__(code, message)
        self.code, self.message, self.request_id, self.data = code, message, request_id, data
        self.status = status or ERROR_CODE_HTTP_STATUS.get(code, 200)


@dataclass(frozen=True, slots=True)
class Message:
    """One JSON-RPC message read from a POST: a request, or a notification (``id`` None)."""

    id: str | int | None
    method: str
    params: dict[str, Any]
    version: str

    @property
    def modern(self) -> bool:
        return self.version in MODERN_PROTOCOL_VERSIONS


# -- sessions (2025-11-25): an id that says all a node needs --------------------------------


def _mac(secret: str, payload: bytes) -> str:
    digest = hmac.new(secret.encode(), payload, hashlib.sha256).digest()[:16]
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def session_id(version: str, key_fingerprint: str) -> str:
    """A session id bound to the key that opened it: its revision and a MAC over it."""
    payload = version.encode()
    encoded = base64.urlsafe_b64encode(payload).decode().rstrip("=")
    return f"{encoded}.{_mac(key_fingerprint, payload)}"


def session_version(value: str, key_fingerprint: str) -> str | None:
    """The revision of a session id this key opened; None for any other."""
    encoded, _, mac = value.partition(".")
    try:
        payload = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
    except ValueError:
        return None
    if not hmac.compare_digest(mac, _mac(key_fingerprint, payload)):
        return None
    version = payload.decode(errors="replace")
    return version if version in HANDSHAKE_PROTOCOL_VERSIONS else None


# -- reading a message -------------------------------------------------------------------


def _envelope(raw: bytes | bytearray) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise ProtocolFault(PARSE_ERROR, "The body is not JSON.") from None
    if not isinstance(body, dict):
        raise ProtocolFault(
            INVALID_REQUEST, "The body must be one JSON-RPC request or notification (no batch)."
        )
    request_id = body.get("id")
    if request_id is not None and (
        isinstance(request_id, bool) or not isinstance(request_id, (str, int))
    ):
        raise ProtocolFault(INVALID_REQUEST, "id must be a string or an integer.")
    if body.get("jsonrpc") != "2.0" or not isinstance(body.get("method"), str):
        raise ProtocolFault(
            INVALID_REQUEST,
            'A JSON-RPC 2.0 message needs "jsonrpc": "2.0" and a method.',
            request_id,
        )
    if "params" in body and not isinstance(body["params"], dict):
        raise ProtocolFault(INVALID_REQUEST, "params must be an object.", request_id)
    return body


def _version(body: dict[str, Any], headers: Mapping[str, str], key_fingerprint: str) -> str:
    """The revision the message speaks (see the table above), or its fault."""
    request_id = body.get("id")
    meta = (body.get("params") or {}).get("_meta")
    header = headers.get(MCP_PROTOCOL_VERSION_HEADER)
    modern = header in MODERN_PROTOCOL_VERSIONS or (
        isinstance(meta, dict) and PROTOCOL_VERSION_META_KEY in meta
    )
    if modern and body["method"] != "initialize":
        if "id" not in body:
            return str(header)  # a notification: nothing of it is read
        verdict = classify_inbound_request(body, headers=headers)
        if isinstance(verdict, InboundLadderRejection):
            raise ProtocolFault(verdict.code, verdict.message, request_id, verdict.data)
        return verdict.protocol_version
    if body["method"] == "initialize":
        asked = (body.get("params") or {}).get("protocolVersion")
        return asked if asked in HANDSHAKE_PROTOCOL_VERSIONS else LATEST_HANDSHAKE
    session = headers.get(SESSION_HEADER.lower())
    if session is not None:
        version = session_version(session, key_fingerprint)
        if version is None:
            # the spec's answer to a session the server does not know: 404, initialize again
            raise ProtocolFault(
                INVALID_REQUEST,
                "Unknown session: initialize again (a session belongs to the key that opened it).",
                request_id,
                status=404,
            )
        return version
    if header is None:
        return DEFAULT_HANDSHAKE_VERSION
    if header not in HANDSHAKE_PROTOCOL_VERSIONS:
        raise ProtocolFault(
            INVALID_REQUEST,
            f"Unsupported MCP-Protocol-Version {header!r}; this server speaks"
            f" {', '.join((*HANDSHAKE_PROTOCOL_VERSIONS, *MODERN_PROTOCOL_VERSIONS))}.",
            request_id,
            status=400,
        )
    return header


def read_message(
    raw: bytes | bytearray, headers: Mapping[str, str], key_fingerprint: str
) -> Message:
    """The message of a POST body; ``headers`` keyed by lower-case name."""
    body = _envelope(raw)
    version = _version(body, headers, key_fingerprint)
    method, request_id = body["method"], body.get("id")
    params = body.get("params") or {}
    if "id" not in body:
        return Message(None, method, params, version)
    if method not in SERVED:
        raise ProtocolFault(METHOD_NOT_FOUND, f"Method not found: {method}.", request_id)
    try:
        wire_methods.validate_client_request(method, version, params)
    except KeyError:
        raise ProtocolFault(
            METHOD_NOT_FOUND, f"{method} is not a method of revision {version}.", request_id
        ) from None
    except ValidationError as exc:
        where = ".".join(str(part) for part in exc.errors()[0]["loc"])
        raise ProtocolFault(
            INVALID_PARAMS, f"Invalid params of {method}: {where or 'params'}.", request_id
        ) from None
    return Message(request_id, method, params, version)


# -- writing an answer ---------------------------------------------------------------------


def result(message: Message, value: dict[str, Any]) -> bytes:
    """The JSON-RPC response carrying ``value``, shaped for the message's revision."""
    if message.modern:
        value = {"resultType": "complete", **value}
        if message.method in wire_methods.CACHEABLE_METHODS:
            # per key: a tools list is private to the key that asked
            value = {"ttlMs": 0, "cacheScope": "private", **value}
    shaped = wire_methods.serialize_server_result(message.method, message.version, value)
    if message.modern:
        shaped["_meta"] = {SERVER_INFO_META_KEY: SERVER_INFO}
    return orjson.dumps({"jsonrpc": "2.0", "id": message.id, "result": shaped})


def initialized(message: Message) -> dict[str, Any]:
    """The ``initialize`` result (2025-11-25 and earlier handshakes)."""
    return {
        "protocolVersion": message.version,
        "capabilities": {"tools": {"listChanged": False}},
        "serverInfo": SERVER_INFO,
        "instructions": INSTRUCTIONS,
    }


def discovered() -> dict[str, Any]:
    """The ``server/discover`` result (2026-07-28)."""
    return {
        "supportedVersions": list(MODERN_PROTOCOL_VERSIONS),
        "capabilities": {"tools": {"listChanged": False}},
        "instructions": INSTRUCTIONS,
    }


def failed_call(text: str) -> dict[str, Any]:
    """A ``tools/call`` result saying the upstream failed (``isError``: the model reads it)."""
    return {"content": [{"type": "text", "text": text}], "isError": True}
