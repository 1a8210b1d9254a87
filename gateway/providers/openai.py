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

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import orjson

from gateway.providers.base import (
    EmbeddingRequest,
    EmbeddingResult,
    ProviderDropped,
    ProviderMalformed,
    ProviderRequest,
    ProviderResult,
    Usage,
)
from gateway.providers.wire import (
    DONE,
    HTTPProvider,
    StreamProgress,
    explanation,
    json_answer,
    stream_ended,
)


class OpenAIProvider(HTTPProvider):
    # -- what a kind speaking OpenAI's wire format at other addresses overrides ------------

    def _path(self, operation: str, upstream_model: str) -> str:
        """The path below ``base_url`` of ``operation`` (``chat/completions``,
        ``embeddings``) for ``upstream_model``."""
        return "/" + operation

    def _passed_on(self, chunk: dict[str, Any]) -> dict[str, Any] | None:
        """A stream chunk as the gateway passes it on; None: not passed on, not output."""
        return chunk

    # ---------------------------------------------------------------------------------------

    async def complete(self, request: ProviderRequest) -> ProviderResult:
        body = {**request.body, "stream": False}
        body.pop("stream_options", None)
        path = self._path("chat/completions", request.upstream_model)
        content = await self._post(path, body, request)
        completion = json_answer(content, "a chat completion", "choices")
        return ProviderResult(completion=completion, usage=Usage.reported(completion.get("usage")))

    async def stream(self, request: ProviderRequest) -> AsyncIterator[dict[str, Any]]:
        body = {**request.body, "stream": True, "stream_options": {"include_usage": True}}
        progress = StreamProgress()
        path = self._path("chat/completions", request.upstream_model)
        batches = self._sse(path, body, request, progress)
        async with aclosing(batches):
            async for batch in batches:
                for chunk in batch:
                    if chunk is DONE:
                        progress.done = True
                        break
                    if "error" in chunk and not chunk.get("choices"):
                        secrets = self._secrets(request.api_key)
                        message, usage = explanation(orjson.dumps(chunk), secrets)
                        raise ProviderDropped(message, usage=usage)
                    passed = self._passed_on(chunk)
                    if passed is None:
                        continue
                    progress.produced = True
                    yield passed
        if not progress.done:
            raise stream_ended(progress.produced, "without [DONE]")

    async def embed(self, request: EmbeddingRequest) -> EmbeddingResult:
        body: dict[str, Any] = {
            "model": request.upstream_model,
            "input": request.inputs,
            "encoding_format": "float",
        }
        if request.dimensions is not None:
            body["dimensions"] = request.dimensions
        path = self._path("embeddings", request.upstream_model)
        content = await self._post(path, body, request)
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
