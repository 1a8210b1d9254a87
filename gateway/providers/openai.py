"""Any OpenAI-compatible HTTP upstream (OpenAI, vLLM, llama.cpp, Ollama, OpenRouter, ...).

One pooled HTTP/1.1 client per provider (:mod:`gateway.providers.http1`, lean on
purpose: it is the hot path) keeps connections alive. Streams are read as the bytes
arrive and passed on chunk by chunk, never buffered; the gateway always asks the upstream
for usage on streams (``stream_options.include_usage``).

Failures are translated at this boundary into the provider error tree of
:mod:`gateway.providers.base`, most specific first:

    upstream answer / client failure             raised
    -------------------------------------------  --------------------------------------
    400 401 403 404 413 422                      ProviderRefused(status, explanation)
    429                                          ProviderRateLimited
    5xx, or any other non-2xx status             ProviderServerError(status)
    200 with a body that is not an answer        ProviderMalformed
    connect error, reset before any output       ProviderUnreachable
    connection lost after output started         ProviderDropped
    no answer (or next chunk) within timeout_s   ProviderTimedOut

The upstream's error text is kept (the client gets it, cleaned, on a refusal) only after
every credential this server holds has been cut out of it (:func:`redact_secrets`): an
upstream that echoes a rejected key must not hand it to whoever sent the call.

Deadlines belong to the gateway: it cancels the call (trio cancellation closes the
connection). The client's own timeouts are a backstop at the provider's ``timeout_s``
(per read, and for a free connection; connecting: at most 10 s); a read timeout there
ends the call like the gateway's own deadline.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import orjson

from gateway.calls.provider_errors import redact_secrets
from gateway.config.settings import ProviderConfig
from gateway.observe.tracing import TraceContext
from gateway.providers.base import (
    EmbeddingRequest,
    EmbeddingResult,
    ProviderDropped,
    ProviderError,
    ProviderMalformed,
    ProviderRateLimited,
    ProviderRefused,
    ProviderRequest,
    ProviderResult,
    ProviderServerError,
    ProviderTimedOut,
    ProviderUnreachable,
    Usage,
)
from gateway.providers.http1 import HTTP1Pool, HTTPFailure, Response, TimedOut

REFUSAL_STATUSES = frozenset({400, 401, 403, 404, 413, 422})


def _explanation(content: bytes, secrets: Iterable[str]) -> tuple[str, Usage | None]:
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


def status_error(status: int, content: bytes, secrets: Iterable[str]) -> ProviderError:
    message, usage = _explanation(content, secrets)
    if status in REFUSAL_STATUSES:
        return ProviderRefused(status, message, usage=usage)
    if status == 429:
        return ProviderRateLimited(message, usage=usage)
    return ProviderServerError(status, message, usage=usage)


class OpenAIProvider:
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

    def _headers(self, api_key: str | None, trace: TraceContext | None) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        if trace is not None:
            headers.update(trace.headers())
        return headers

    def _secrets(self, api_key: str | None) -> list[str]:
        return [*self.secrets(), *([api_key] if api_key else [])]

    async def _post(
        self, path: str, body: dict[str, Any], api_key: str | None, trace: TraceContext | None
    ) -> bytes:
        """One non-streamed upstream call: the body of a 200 answer, or the provider
        error it maps to."""
        try:
            response = await self.pool.post(path, self._headers(api_key, trace), orjson.dumps(body))
            try:
                content = await response.read()
            finally:
                await response.aclose()
        except TimedOut:
            raise ProviderTimedOut("the upstream did not answer within timeout_s") from None
        except HTTPFailure as exc:
            raise ProviderUnreachable(str(exc)) from None
        if response.status != 200:
            raise status_error(response.status, content, self._secrets(api_key))
        return content

    async def complete(self, request: ProviderRequest) -> ProviderResult:
        body = {**request.body, "stream": False}
        body.pop("stream_options", None)
        content = await self._post("/chat/completions", body, request.api_key, request.trace)
        try:
            completion = orjson.loads(content)
        except orjson.JSONDecodeError:
            raise ProviderMalformed("the upstream answered with invalid JSON") from None
        if not isinstance(completion, dict) or not isinstance(completion.get("choices"), list):
            raise ProviderMalformed("the upstream answer is not a chat completion")
        return ProviderResult(completion=completion, usage=Usage.reported(completion.get("usage")))

    async def stream(self, request: ProviderRequest) -> AsyncIterator[dict[str, Any]]:
        body = {**request.body, "stream": True, "stream_options": {"include_usage": True}}
        produced = False
        done = False
        response: Response | None = None
        try:
            response = await self.pool.post(
                "/chat/completions",
                self._headers(request.api_key, request.trace),
                orjson.dumps(body),
            )
            if response.status != 200:
                raise status_error(
                    response.status, await response.read(), self._secrets(request.api_key)
                )
            rest = b""
            async for piece in response.iter_body():
                if done:
                    continue  # read to its end, so the connection goes back to the pool
                if b"\r" in piece:
                    # CR and CRLF end lines too (SSE); a CRLF cut in two adds a blank line
                    piece = piece.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
                lines = (rest + piece).split(b"\n") if rest else piece.split(b"\n")
                rest = lines.pop()
                for line in lines:
                    chunk = _sse_data(line)
                    if chunk is None:
                        continue
                    if chunk is DONE:
                        done = True
                        break
                    if "error" in chunk and not chunk.get("choices"):
                        secrets = self._secrets(request.api_key)
                        message, usage = _explanation(orjson.dumps(chunk), secrets)
                        raise ProviderDropped(message, usage=usage)
                    produced = True
                    yield chunk
            if not done and _sse_data(rest) is DONE:
                done = True  # the last line, without its line break
        except HTTPFailure as exc:
            if done:
                return
            if isinstance(exc, TimedOut):
                raise ProviderTimedOut("the upstream stalled past timeout_s") from None
            if produced:
                raise ProviderDropped(str(exc)) from None
            raise ProviderUnreachable(str(exc)) from None
        finally:
            if response is not None:
                await response.aclose()
        if done:
            return
        if produced:
            # the upstream closed the stream without [DONE]: the connection was lost
            raise ProviderDropped("the stream ended without [DONE]")
        raise ProviderUnreachable("the upstream closed the stream before any output")

    async def embed(self, request: EmbeddingRequest) -> EmbeddingResult:
        body: dict[str, Any] = {
            "model": request.upstream_model,
            "input": request.inputs,
            "encoding_format": "float",
        }
        if request.dimensions is not None:
            body["dimensions"] = request.dimensions
        content = await self._post("/embeddings", body, request.api_key, request.trace)
        try:
            data = orjson.loads(content)
            rows = sorted(data["data"], key=lambda row: row["index"])
            vectors = [[float(x) for x in row["embedding"]] for row in rows]
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            raise ProviderMalformed("the upstream embeddings answer is malformed") from None
        usage = Usage.reported(data.get("usage")) or Usage(prompt_tokens=0)
        return EmbeddingResult(vectors=vectors, usage=usage)

    def ignored_parameters(self, body: dict[str, Any]) -> list[str]:
        """An OpenAI-compatible upstream does not say what it ignored; we claim nothing."""
        return []

    async def aclose(self) -> None:
        await self.pool.aclose()


#: what :func:`_sse_data` returns for ``data: [DONE]``
DONE: Any = object()


def _sse_data(line: bytes) -> Any:
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
