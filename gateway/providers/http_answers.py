"""What every HTTP provider kind does with an upstream's answer, in one place.

A status maps to the provider error tree the same way for every kind (a kind may refine
it first, e.g. Bedrock's 408 model timeout), and so does a failure of the connection
(:mod:`gateway.providers.http1`'s three exceptions), before or after output started:

    400 401 403 404 413 422                      ProviderRefused(status, explanation)
    429                                          ProviderRateLimited
    5xx, or any other non-2xx status             ProviderServerError(status)
    connect error, reset before any output       ProviderUnreachable
    connection lost after output started         ProviderDropped
    no answer (or next piece) within timeout_s   ProviderTimedOut
"""

from __future__ import annotations

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
from gateway.providers.http1 import HTTP1Pool, HTTPFailure, Response, TimedOut

REFUSAL_STATUSES = frozenset({400, 401, 403, 404, 413, 422})


def error_for_status(status: int, message: str, usage: Usage | None = None) -> ProviderError:
    """The provider error of a non-2xx answer; ``message`` already cleaned of secrets."""
    if status in REFUSAL_STATUSES:
        return ProviderRefused(status, message, usage=usage)
    if status == 429:
        return ProviderRateLimited(message, usage=usage)
    return ProviderServerError(status, message, usage=usage)


def failure_error(exc: HTTPFailure, *, produced: bool) -> ProviderError:
    """The provider error of a connection that failed while an answer was awaited."""
    if isinstance(exc, TimedOut):
        if produced:
            return ProviderTimedOut("the upstream stalled past timeout_s")
        return ProviderTimedOut("the upstream did not answer within timeout_s")
    if produced:
        return ProviderDropped(str(exc))
    return ProviderUnreachable(str(exc))


async def post_whole(
    pool: HTTP1Pool, path: str, headers: dict[str, str], body: bytes
) -> tuple[Response, bytes]:
    """One non-streamed call: the answer (its status and headers) and its whole body."""
    try:
        response = await pool.post(path, headers, body)
        try:
            content = await response.read()
        finally:
            await response.aclose()
    except HTTPFailure as exc:
        raise failure_error(exc, produced=False) from None
    return response, content
