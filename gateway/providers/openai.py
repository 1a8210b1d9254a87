"""Any OpenAI-compatible HTTP upstream (OpenAI, vLLM, llama.cpp, Ollama, OpenRouter, ...).

One shared ``httpx.AsyncClient`` per provider keeps connections pooled. Streams are read
line by line and passed on chunk by chunk, never buffered; the gateway always asks the
upstream for usage on streams (``stream_options.include_usage``).

httpx failures are translated at this boundary into the provider error tree of
:mod:`gateway.providers.base`, most specific first:

    upstream answer / httpx failure              raised
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
connection). httpx's own timeouts are a backstop at the provider's ``timeout_s``; a
read timeout there ends the call like the gateway's own deadline.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import httpx
import orjson

from gateway.config import ProviderConfig
from gateway.provider_errors import redact_secrets
from gateway.providers.base import (
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
from gateway.tracing import TraceContext

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
        self.base_url = config.base_url.rstrip("/")
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(config.timeout_s, connect=min(10.0, config.timeout_s)),
            limits=httpx.Limits(
                max_connections=config.max_connections,
                max_keepalive_connections=config.max_connections,
            ),
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
    ) -> httpx.Response:
        """One non-streamed upstream call: a 200 answer, or the provider error it maps to."""
        try:
            response = await self.client.post(
                f"{self.base_url}{path}",
                content=orjson.dumps(body),
                headers=self._headers(api_key, trace),
            )
        except httpx.ReadTimeout:
            raise ProviderTimedOut("the upstream did not answer within timeout_s") from None
        except httpx.HTTPError as exc:
            raise ProviderUnreachable(type(exc).__name__) from None
        if response.status_code != 200:
            raise status_error(response.status_code, response.content, self._secrets(api_key))
        return response

    async def complete(self, request: ProviderRequest) -> ProviderResult:
        body = {**request.body, "stream": False}
        body.pop("stream_options", None)
        response = await self._post("/chat/completions", body, request.api_key, request.trace)
        try:
            completion = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            raise ProviderMalformed("the upstream answered with invalid JSON") from None
        if not isinstance(completion, dict) or not isinstance(completion.get("choices"), list):
            raise ProviderMalformed("the upstream answer is not a chat completion")
        return ProviderResult(completion=completion, usage=Usage.reported(completion.get("usage")))

    async def stream(self, request: ProviderRequest) -> AsyncIterator[dict[str, Any]]:
        body = {**request.body, "stream": True, "stream_options": {"include_usage": True}}
        produced = False
        done = False
        try:
            async with self.client.stream(
                "POST",
                f"{self.base_url}/chat/completions",
                content=orjson.dumps(body),
                headers=self._headers(request.api_key, request.trace),
            ) as response:
                if response.status_code != 200:
                    raise status_error(
                        response.status_code,
                        await response.aread(),
                        self._secrets(request.api_key),
                    )
                async for line in response.aiter_lines():
                    chunk = _sse_data(line)
                    if chunk is None or done:
                        continue
                    if chunk == "[DONE]":
                        # read the body to its end so the pooled connection is released cleanly
                        done = True
                        continue
                    if isinstance(chunk, dict) and "error" in chunk and not chunk.get("choices"):
                        secrets = self._secrets(request.api_key)
                        message, usage = _explanation(orjson.dumps(chunk), secrets)
                        raise ProviderDropped(message, usage=usage)
                    produced = True
                    yield chunk
        except httpx.HTTPError as exc:
            if done:
                return
            if isinstance(exc, httpx.ReadTimeout):
                raise ProviderTimedOut("the upstream stalled past timeout_s") from None
            if produced:
                raise ProviderDropped(type(exc).__name__) from None
            raise ProviderUnreachable(type(exc).__name__) from None
        if done:
            return
        if produced:
            # the upstream closed the stream without [DONE]: the connection was lost
            raise ProviderDropped("the stream ended without [DONE]")
        raise ProviderUnreachable("the upstream closed the stream before any output")

    async def embed(
        self,
        upstream_model: str,
        inputs: list[Any],
        dimensions: int | None,
        api_key: str | None,
        trace: TraceContext | None = None,
    ) -> EmbeddingResult:
        body: dict[str, Any] = {
            "model": upstream_model,
            "input": inputs,
            "encoding_format": "float",
        }
        if dimensions is not None:
            body["dimensions"] = dimensions
        response = await self._post("/embeddings", body, api_key, trace)
        try:
            data = orjson.loads(response.content)
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
        await self.client.aclose()


def _sse_data(line: str) -> Any:
    """The JSON of one ``data:`` line (or the string ``[DONE]``); None for anything else."""
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if payload == "[DONE]":
        return payload
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
