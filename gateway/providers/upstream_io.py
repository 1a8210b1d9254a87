"""What every HTTP provider kind shares: one JSON ``POST``, its failures mapped into the
provider error tree, and the reading of a server-sent event stream.

    upstream answer / client failure             raised
    -------------------------------------------  --------------------------------------
    400 401 403 404 413 422                      ProviderRefused(status, explanation)
    429                                          ProviderRateLimited
    5xx (Anthropic's 529), any other non-2xx     ProviderServerError(status)
    connect error, reset before any output       ProviderUnreachable
    connection lost after output started         ProviderDropped
    no answer (or next chunk) within timeout_s   ProviderTimedOut

An upstream's error text is kept (the client gets it, cleaned, on a refusal) only after
every credential this server holds has been cut out of it (:func:`redact_secrets`): an
upstream that echoes a rejected key must not hand it to whoever sent the call. OpenAI
(``{"error": {"message": ...}}``) and Anthropic (``{"type": "error", "error": {"type":
..., "message": ...}}``) put the message at the same place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import orjson

from gateway.calls.provider_errors import redact_secrets
from gateway.config.settings import ProviderConfig
from gateway.providers.base import (
    ProviderDropped,
    ProviderError,
    ProviderRateLimited,
    ProviderRefused,
    ProviderServerError,
    ProviderTimedOut,
    ProviderUnreachable,
    Usage,
)
from gateway.providers.http1 import HTTP1Pool, HTTPFailure, TimedOut

REFUSAL_STATUSES = frozenset({400, 401, 403, 404, 413, 422})


class HTTPProvider:
    """What a provider of an HTTP kind holds: its configuration, the credentials to cut
    out of upstream error text, and one pooled client of its ``base_url``."""

    def __init__(
        self, config: ProviderConfig, secrets: Callable[[], Iterable[str]] = tuple
    ) -> None:
        """``secrets``: every credential the server holds now (its own keys and the
        organisations' BYOK keys), cut out of the upstream's error text."""
        assert config.base_url is not None
        self.config = config
        self.secrets = secrets
        self.pool = HTTP1Pool(
            config.base_url,
            max_connections=config.max_connections,
            timeout=config.timeout_s,
            connect_timeout=min(10.0, config.timeout_s),
        )

    def _secrets(self, api_key: str | None) -> list[str]:
        """The credentials to cut out of this call's error text (its key included)."""
        return [*self.secrets(), *([api_key] if api_key else [])]

    async def aclose(self) -> None:
        await self.pool.aclose()


def explanation(content: bytes, secrets: Iterable[str]) -> tuple[str, Usage | None]:
    """The upstream's error message (``secrets`` cut out) and any usage it reported in
    OpenAI's shape."""
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError:
        return redact_secrets(content.decode("utf-8", "replace"), secrets)[:500], None
    if not isinstance(body, dict):
        return redact_secrets(str(body), secrets)[:500], None
    error = body.get("error")
    message = error.get("message") if isinstance(error, dict) else error
    return redact_secrets(str(message or body), secrets)[:500], Usage.reported(body.get("usage"))


def status_error(status: int, content: bytes, secrets: Iterable[str]) -> ProviderError:
    message, usage = explanation(content, secrets)
    if status in REFUSAL_STATUSES:
        return ProviderRefused(status, message, usage=usage)
    if status == 429:
        return ProviderRateLimited(message, usage=usage)
    return ProviderServerError(status, message, usage=usage)


async def post_json(
    pool: HTTP1Pool, path: str, headers: dict[str, str], body: bytes, secrets: Iterable[str]
) -> bytes:
    """One non-streamed upstream call: the body of a 200 answer, or the provider error it
    maps to."""
    try:
        response = await pool.post(path, headers, body)
        try:
            content = await response.read()
        finally:
            await response.aclose()
    except TimedOut:
        raise ProviderTimedOut("the upstream did not answer within timeout_s") from None
    except HTTPFailure as exc:
        raise ProviderUnreachable(str(exc)) from None
    if response.status != 200:
        raise status_error(response.status, content, secrets)
    return content


def stream_failure(exc: HTTPFailure, produced: bool) -> ProviderError:
    """The provider error of a stream's connection failing (``produced``: after output)."""
    if isinstance(exc, TimedOut):
        return ProviderTimedOut("the upstream stalled past timeout_s")
    if produced:
        return ProviderDropped(str(exc))
    return ProviderUnreachable(str(exc))


def split_lines(rest: bytes, piece: bytes) -> tuple[list[bytes], bytes]:
    """The complete lines of ``rest + piece`` and what is left after the last line break.

    CR and CRLF end lines too (SSE); a CRLF cut in two adds a blank line, which SSE
    readers skip."""
    if b"\r" in piece:
        piece = piece.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    lines = (rest + piece).split(b"\n") if rest else piece.split(b"\n")
    return lines, lines.pop()


#: what :func:`sse_data` returns for ``data: [DONE]``
DONE: Any = object()


def sse_data(line: bytes) -> Any:
    """The JSON object of one ``data:`` line, or :data:`DONE`; None for anything else
    (another field, such as Anthropic's ``event:``, a comment, a payload that is not a
    JSON object)."""
    if not line.startswith(b"data:"):
        return None
    payload = line[5:].strip()
    if payload == b"[DONE]":
        return DONE
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None
