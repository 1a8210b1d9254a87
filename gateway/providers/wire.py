"""What every HTTP provider kind shares: its pooled client and credentials
and its calls (:class:`HTTPProvider`: one JSON ``POST`` opened as a stream, its status
mapped into the provider error tree, read whole when no stream is wanted), an upstream's
error status mapped, and SSE's line framing.

    upstream answer / client failure             raised
    -------------------------------------------  --------------------------------------
    400 401 403 404 413 422                      ProviderRefused(status, explanation)
    429                                          ProviderRateLimited
    5xx, or any other non-2xx status             ProviderServerError(status)
    connect error, reset before any output       ProviderUnreachable
    connection lost after output started         ProviderDropped
    no answer (or next chunk) within timeout_s   ProviderTimedOut

The upstream's error text is kept only after every credential this server holds has been
cut out of it (:func:`redact_secrets`). OpenAI, Azure, Gemini and Anthropic
(``{"type": "error", "error": {"type": ..., "message": ...}}``) all put it in
``{"error": {"message": ...}}``.
"""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator, Callable, Iterable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from gateway.calls.provider_errors import redact_secrets
from gateway.config.settings import ProviderConfig
from gateway.observe.tracing import TraceContext
from gateway.providers.base import (
    ProviderDropped,
    ProviderError,
    ProviderMalformed,
    ProviderRateLimited,
    ProviderRefused,
    ProviderServerError,
    ProviderTimedOut,
    ProviderUnreachable,
    Usage,
)
from gateway.providers.http1 import HTTP1Pool, HTTPFailure, Response, TimedOut

REFUSAL_STATUSES = frozenset({400, 401, 403, 404, 413, 422})


class Caller(Protocol):
    """What an upstream call is sent with, read from its request (a chat, embeddings or
    Messages request): the key to send (none: the kind's own) and the call's trace."""

    @property
    def api_key(self) -> str | None: ...

    @property
    def trace(self) -> TraceContext | None: ...


@dataclass
class StreamProgress:
    """How far a streamed answer has come, as its reader tells :meth:`HTTPProvider._sse`."""

    #: output has started: a connection lost from now on is dropped, not unreachable
    produced: bool = False
    #: the answer is whole (or failed): the rest is read but not used, and a connection
    #: lost from now on loses nothing
    done: bool = False


class HTTPProvider:
    """What every HTTP kind holds: its configuration, one pooled client of its
    ``base_url``, and the credentials to cut out of its error text. A kind names the
    header its key goes in (``auth_header``, the value ``auth_prefix`` + the key)."""

    auth_header = "Authorization"
    auth_prefix = "Bearer "

    def __init__(
        self, config: ProviderConfig, secrets: Callable[[], Iterable[str]] = tuple
    ) -> None:
        """``secrets``: every credential the server holds now (its own keys and the
        organisations' BYOK keys), cut out of the upstream's error text."""
        self.config = config
        self.secrets = secrets
        self.pool = pool_for(config)

    def _headers(self, api_key: str | None, trace: TraceContext | None) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers[self.auth_header] = self.auth_prefix + api_key
        if trace is not None:
            headers.update(trace.headers())
        return headers

    def _secrets(self, api_key: str | None) -> list[str]:
        return [*self.secrets(), *([api_key] if api_key else [])]

    async def _post(
        self, path: str, body: Any, caller: Caller, extra: dict[str, str] | None = None
    ) -> bytes:
        """One non-streamed upstream call: the body of a 200 answer, or the provider
        error it maps to (a connection that fails included). ``extra``: headers of this
        call besides the kind's own."""
        try:
            response = await self._open_stream(path, body, caller, extra)
            try:
                return await response.read()
            finally:
                await response.aclose()
        except HTTPFailure as exc:
            raise stream_failure(exc, produced=False) from None

    async def _open_stream(
        self, path: str, body: Any, caller: Caller, extra: dict[str, str] | None = None
    ) -> Response:
        """A streamed call's answer, its head read (the caller closes it); a status other
        than 200 raised as its provider error. The client's failures are the caller's to
        map (whether output had started decides)."""
        headers = {**self._headers(caller.api_key, caller.trace), **(extra or {})}
        response = await self.pool.post(path, headers, orjson.dumps(body))
        if response.status == 200:
            return response
        try:
            content = await response.read()
        finally:
            await response.aclose()
        error = self._status_error(response.status, content, caller.api_key)
        raise with_retry_after(error, response)

    async def _sse(
        self,
        path: str,
        body: Any,
        caller: Caller,
        progress: StreamProgress,
        extra: dict[str, str] | None = None,
    ) -> AsyncGenerator[list[Any], None]:
        """The data of the ``data:`` lines of a streamed call (:func:`sse_data`: a JSON
        object or :data:`DONE`), a list for each read of the upstream (one generator step
        for a read, not for each line: a step cost a few µs of every chunk), the last
        line's too (without its line break). The reader sets ``progress.done`` at the
        end of the answer and reads no item after it; from the next read on nothing is
        parsed, and the rest is read to its end, so the connection goes back to the pool.
        A connection that fails before then is raised as its provider error. Read it
        under ``aclosing``."""
        response: Response | None = None
        try:
            response = await self._open_stream(path, body, caller, extra)
            rest = b""
            # closed with this generator when its reader stops early (an output
            # guardrail's deny, a client gone), not left to the collector
            async with aclosing(response.iter_body()) as pieces:
                async for piece in pieces:
                    if progress.done:
                        continue  # read to its end, so the connection goes back to the pool
                    lines, rest = split_lines(rest, piece)
                    batch = [data for line in lines if (data := sse_data(line)) is not None]
                    if batch:
                        yield batch
            tail = None if progress.done else sse_data(rest)
            if tail is not None:
                yield [tail]
        except HTTPFailure as exc:
            if not progress.done:
                raise stream_failure(exc, progress.produced) from None
        finally:
            if response is not None:
                await response.aclose()

    def _status_error(self, status: int, content: bytes, api_key: str | None) -> ProviderError:
        """The provider error of an answer with another status than 200 (a kind may read
        more of its error body)."""
        return status_error(status, content, self._secrets(api_key))

    async def aclose(self) -> None:
        await self.pool.aclose()


def explanation(content: bytes, secrets: Iterable[str]) -> tuple[str, Usage | None]:
    """The upstream's error message (``secrets`` cut out) and any usage it reported."""
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError:
        return redact_secrets(content.decode("utf-8", "replace"), secrets)[:500], None
    if not isinstance(body, dict):
        return redact_secrets(str(body), secrets)[:500], None
    error = body.get("error")
    message = error.get("message") if isinstance(error, dict) else error
    return redact_secrets(str(message or body), secrets)[:500], Usage.reported(body.get("usage"))


def pool_for(config: ProviderConfig) -> HTTP1Pool:
    """The pooled client of a provider's ``base_url``."""
    assert config.base_url is not None
    return HTTP1Pool(
        config.base_url,
        max_connections=config.max_connections,
        timeout=config.timeout_s,
        connect_timeout=min(10.0, config.timeout_s),
    )


async def exchange(
    pool: HTTP1Pool, path: str, headers: dict[str, str], body: bytes
) -> tuple[Response, bytes]:
    """One non-streamed call: the answer (its status and headers) and its whole body; a
    connection that fails is its provider error."""
    try:
        response = await pool.post(path, headers, body)
        try:
            content = await response.read()
        finally:
            await response.aclose()
    except HTTPFailure as exc:
        raise stream_failure(exc, produced=False) from None
    return response, content


def status_error(status: int, content: bytes, secrets: Iterable[str]) -> ProviderError:
    return error_for_status(status, *explanation(content, secrets))


def with_retry_after(error: ProviderError, response: Response) -> ProviderError:
    """A 429's Retry-After (seconds; an HTTP date is not read) kept on its error: the
    router cools the deployment that long (bounded)."""
    if isinstance(error, ProviderRateLimited):
        raw = response.headers.get(b"retry-after", b"").strip()
        try:
            seconds = float(raw.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            return error
        if math.isfinite(seconds) and seconds >= 0:
            error.retry_after = seconds
    return error


def error_for_status(status: int, message: str, usage: Usage | None = None) -> ProviderError:
    """The provider error of a non-2xx answer; ``message`` already cleaned of secrets."""
    if status in REFUSAL_STATUSES:
        return ProviderRefused(status, message, usage=usage)
    if status == 429:
        return ProviderRateLimited(message, usage=usage)
    return ProviderServerError(status, message, usage=usage)


def stream_failure(exc: HTTPFailure, produced: bool) -> ProviderError:
    """The provider error of a connection failing while an answer was awaited
    (``produced``: after output had started)."""
    if isinstance(exc, TimedOut):
        if produced:
            return ProviderTimedOut("the upstream stalled past timeout_s")
        return ProviderTimedOut("the upstream did not answer within timeout_s")
    if produced:
        return ProviderDropped(str(exc))
    return ProviderUnreachable(str(exc))


def stream_ended(produced: bool, how: str, usage: Usage | None = None) -> ProviderError:
    """The provider error of a stream the upstream closed before its end marker (``how``:
    "without [DONE]", ...): the connection was lost after output (``produced``), or the
    upstream never answered."""
    if produced:
        return ProviderDropped(f"the stream ended {how}", usage=usage)
    return ProviderUnreachable("the upstream closed the stream before any output")


def json_answer(content: bytes, what: str, member: str | None = None) -> dict[str, Any]:
    """A 200 answer's JSON object (with a list as ``member``, when named); anything else
    is :class:`ProviderMalformed` ("the upstream answer is not {what}")."""
    try:
        answer = orjson.loads(content)
    except orjson.JSONDecodeError:
        raise ProviderMalformed("the upstream answered with invalid JSON") from None
    if not isinstance(answer, dict) or (
        member is not None and not isinstance(answer.get(member), list)
    ):
        raise ProviderMalformed(f"the upstream answer is not {what}")
    return answer


def split_lines(rest: bytes, piece: bytes) -> tuple[list[bytes], bytes]:
    """The complete lines of ``rest + piece`` (a stream's unfinished line, then the next
    bytes read) and the new unfinished line. CR and CRLF end lines too (SSE); a CRLF cut
    in two adds a blank line (harmless: every event read here is one ``data:`` line)."""
    if b"\r" in piece:
        piece = piece.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    lines = (rest + piece).split(b"\n") if rest else piece.split(b"\n")
    return lines, lines.pop()


#: what :func:`sse_data` returns for ``data: [DONE]``
DONE: Any = object()


def sse_data(line: bytes) -> Any:
    """The JSON object of one ``data:`` line, or :data:`DONE`; None for anything else
    (another field, a comment, a payload that is not a JSON object)."""
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
