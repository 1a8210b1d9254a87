"""Authentication and scopes: steps 1 and 2 of the request walk.

Every failure is the same 401 invalid_api_key: a missing header, another scheme, a
malformed token, an unknown, revoked, expired or disabled key, a sub-key whose parent
is in such a state. The body never tells which.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quart import g, request

from gateway.accounts.key_record import KeyRecord
from gateway.calls.admission import admit, count_request, rate_headers
from gateway.edge import exchange
from gateway.edge.http import request_globals
from gateway.errors import GatewayError
from shards import Admission

if TYPE_CHECKING:
    from gateway.serving.runtime import Runtime

INVALID_KEY_MESSAGE = "The API key is invalid, revoked or expired."
#: a key sent the Anthropic SDKs' default way (their api_key=): this gateway reads Bearer only
X_API_KEY_MESSAGE = (
    "Send the key as Authorization: Bearer <key> (Anthropic SDKs: auth_token=; Claude Code: "
    "ANTHROPIC_AUTH_TOKEN); the x-api-key header is not accepted."
)


def bearer_token() -> str | None:
    headers = request.headers.getlist("Authorization")
    if not headers:
        return None
    if len(headers) > 1:  # one credential per request: which one would be meant?
        return ""
    header = headers[0]
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return ""
    return token.strip()


async def authenticate(rt: Runtime) -> KeyRecord:
    """Step 1. A key held in memory answers without an await; with several nodes, a key
    this node does not hold is looked up in the store first (:mod:`gateway.accounts.key_lookup`)."""
    token = bearer_token()
    record = rt.keyring.authenticate(token) if token else None
    if record is None and token and rt.cluster is not None:
        record = await rt.cluster.keys.find(token, request.remote_addr or "")
    if record is None:
        sent_elsewhere = token is None and "x-api-key" in request.headers
        raise GatewayError(
            "invalid_api_key", X_API_KEY_MESSAGE if sent_elsewhere else INVALID_KEY_MESSAGE
        )
    record = rt.keyring.touch(record)
    globals_ = request_globals()
    globals_.key = record  # the request's log line names its key
    exchange.identified(globals_.request_id, record)
    return record


async def require_scope(rt: Runtime, record: KeyRecord, scope: str) -> None:
    """Step 2. A refused request still counts in the key's request window (the spec's
    rpm counts every request, refused ones included), though its answer carries no
    rate-limit headers."""
    if scope not in record.scopes:
        await count_request(rt, record)
        raise GatewayError(
            "scope_denied", f"This key lacks the {scope} scope required by this endpoint."
        )


async def admit_reader(rt: Runtime, scope: str | None) -> KeyRecord:
    """Steps 1 to 3 of a read: authenticate, check the scope (if any), admit without
    an in-flight slot (reads count in the request window and never take one)."""
    record = await authenticate(rt)
    if scope is not None:
        await require_scope(rt, record, scope)
    await admit_request(rt, record)
    return record


async def admit_request(rt: Runtime, record: KeyRecord) -> None:
    """Step 3 of a request that takes no in-flight slot (a read, an idempotent repeat, a
    body refused): counted in the key's request window (its 429 past the limit)."""
    carry_rate_headers(await admit(rt, record, take_slot=False))


def carry_rate_headers(admission: Admission) -> None:
    """The request was admitted: every answer to it carries its rate-limit headers."""
    g.rate_headers = rate_headers(admission)
