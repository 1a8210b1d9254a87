"""Authentication and scopes: steps 1 and 2 of the request walk.

Every failure is the same 401 invalid_api_key: a missing header, another scheme, a
malformed token, an unknown, revoked, expired or disabled key, a sub-key whose parent
is in such a state. The body never tells which.
"""

from __future__ import annotations

from quart import g, request

from gateway.admission import count_request
from gateway.errors import GatewayError
from gateway.http import runtime
from gateway.keys import KeyRecord

INVALID_KEY_MESSAGE = "The API key is invalid, revoked or expired."


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


def authenticate() -> KeyRecord:
    token = bearer_token()
    record = runtime().keyring.authenticate(token) if token else None
    if record is None:
        raise GatewayError("invalid_api_key", INVALID_KEY_MESSAGE)
    record = runtime().keyring.touch(record)
    g.key = record
    return record


async def require_scope(record: KeyRecord, scope: str) -> None:
    """Step 2. A refused request still counts in the key's request window (the spec's
    rpm counts every request, refused ones included), though its answer carries no
    rate-limit headers."""
    if scope not in record.scopes:
        await count_request(record)
        raise GatewayError(
            "scope_denied", f"This key lacks the {scope} scope required by this endpoint."
        )
