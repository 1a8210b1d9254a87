"""Authentication and scopes: steps 1 and 2 of the request walk.

Every failure is the same 401 invalid_api_key: a missing header, another scheme, a
malformed token, an unknown, revoked, expired or disabled key, a sub-key whose parent
is in such a state. The body never tells which.
"""

from __future__ import annotations

from quart import g, request

from gateway.errors import GatewayError
from gateway.http import runtime
from gateway.keys import KeyRecord

INVALID_KEY_MESSAGE = "The API key is invalid, revoked or expired."


def bearer_token() -> str | None:
    header = request.headers.get("Authorization")
    if header is None:
        return None
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


def require_scope(record: KeyRecord, scope: str) -> None:
    if scope not in record.scopes:
        raise GatewayError(
            "scope_denied", f"This key lacks the {scope} scope required by this endpoint."
        )
