"""The Gemini API (``kind = "gemini"``): generateContent, streamGenerateContent (SSE) and
batchEmbedContents, on the pooled HTTP/1.1 client, the key in ``x-goog-api-key``.

    POST {base_url}/v1beta/models/{upstream_id}:generateContent
    POST {base_url}/v1beta/models/{upstream_id}:streamGenerateContent?alt=sse
    POST {base_url}/v1beta/models/{upstream_id}:batchEmbedContents

Failures map as for every HTTP kind (:mod:`gateway.providers.wire`): Gemini's error body
``{"error": {"code", "message", "status", "details"}}`` gives the explanation, cut of
every credential the server holds (Google's "API key not valid" messages may carry the
key). A 429 (RESOURCE_EXHAUSTED) is ProviderRateLimited; its ``RetryInfo.retryDelay`` is
not passed on: the spec fixes the client's Retry-After at 30 s for a provider limiting a
model. A body the translation cannot write for Gemini (an image it cannot take, a
recursive schema, a tool result for no known call) is refused here, before the upstream
is called, as a 400 refusal whose explanation says what to send instead.

A stream has no ``[DONE]``: Gemini ends it by ending the body. A stream whose event with
the ``finishReason`` came ended well (even if the connection then broke: the whole answer
and its usage are in); one that ends or breaks before is a dropped connection (before any
output: unreachable), and so is an ``error`` event, with its explanation. The usage of the
events before a drop is not passed on: Gemini's counts so far are not the call's, and a
drop counts the full estimate, as for every kind.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import orjson

from gateway.calls.estimate import estimate_embedding_tokens
from gateway.providers.base import (
    EmbeddingRequest,
    EmbeddingResult,
    ProviderDropped,
    ProviderError,
    ProviderMalformed,
    ProviderRefused,
    ProviderRequest,
    ProviderResult,
    Usage,
)
from gateway.providers.gemini.gemini_answer import ChunkTranslator, Unreadable, completion
from gateway.providers.gemini.gemini_request import (
    IGNORED,
    TranslationRefused,
    generate_request,
)
from gateway.providers.http1 import HTTPFailure, Response
from gateway.providers.wire import (
    HTTPProvider,
    explanation,
    split_lines,
    sse_data,
    stream_ended,
    stream_failure,
)


class GeminiProvider(HTTPProvider):
    auth_header = "x-goog-api-key"
    auth_prefix = ""

    @staticmethod
    def _path(upstream_model: str, method: str) -> str:
        model = quote(upstream_model.removeprefix("models/"), safe="-._~")
        return f"/v1beta/models/{model}:{method}"

    @staticmethod
    def _request(request: ProviderRequest) -> dict[str, Any]:
        try:
            return generate_request(request.body)
        except TranslationRefused as exc:
            raise ProviderRefused(400, str(exc)) from None

    async def complete(self, request: ProviderRequest) -> ProviderResult:
        body = self._request(request)
        path = self._path(request.upstream_model, "generateContent")
        content = await self._post(path, body, request)
        try:
            answer = orjson.loads(content)
            result, usage = completion(answer, request.request_id, request.upstream_model)
        except (orjson.JSONDecodeError, Unreadable):
            raise ProviderMalformed("the upstream answer is not a Gemini answer") from None
        return ProviderResult(completion=result, usage=usage)

    async def stream(self, request: ProviderRequest) -> AsyncIterator[dict[str, Any]]:
        body = self._request(request)
        translator = ChunkTranslator(request.request_id, request.upstream_model)
        response: Response | None = None
        try:
            path = self._path(request.upstream_model, "streamGenerateContent?alt=sse")
            response = await self._open_stream(path, body, request)
            rest = b""
            failure: ProviderError | None = None
            async for piece in response.iter_body():
                if failure is not None:
                    continue  # read to its end, so the connection goes back to the pool
                lines, rest = split_lines(rest, piece)
                for line in lines:
                    try:
                        chunks = self._event(line, translator, request.api_key)
                    except ProviderError as exc:
                        failure = exc
                        break
                    for chunk in chunks:
                        yield chunk
            if failure is not None:
                raise failure
            for chunk in self._event(rest, translator, request.api_key):
                yield chunk
        except HTTPFailure as exc:
            if not translator.finished:  # else the whole answer came: it stands
                raise stream_failure(exc, translator.started) from None
        finally:
            if response is not None:
                await response.aclose()
        if translator.finished:
            for chunk in translator.end():
                yield chunk
            return
        raise stream_ended(translator.started, "before its finishReason")

    def _event(
        self, line: bytes, translator: ChunkTranslator, api_key: str | None
    ) -> list[dict[str, Any]]:
        event = sse_data(line)
        if not isinstance(event, dict):
            return []
        if "error" in event:
            message, _ = explanation(orjson.dumps(event), self._secrets(api_key))
            raise ProviderDropped(message)
        try:
            return translator.chunks(event)
        except Unreadable:
            raise ProviderMalformed("a stream event is not a Gemini answer") from None

    async def embed(self, request: EmbeddingRequest) -> EmbeddingResult:
        """One batchEmbedContents call for every input. Gemini embeds text only, and its
        answer reports no token count: the call is counted at the gateway's estimate of
        the inputs (the bound its reservation used)."""
        upstream_model, inputs, dimensions = (
            request.upstream_model,
            request.inputs,
            request.dimensions,
        )
        if not all(isinstance(item, str) for item in inputs):
            raise ProviderRefused(
                400, "Gemini embeds text only: send input as a string or an array of strings"
            )
        model = f"models/{upstream_model.removeprefix('models/')}"
        requests = []
        for text in inputs:
            item: dict[str, Any] = {"model": model, "content": {"parts": [{"text": text}]}}
            if dimensions is not None:
                item["outputDimensionality"] = dimensions
            requests.append(item)
        path = self._path(upstream_model, "batchEmbedContents")
        content = await self._post(path, {"requests": requests}, request)
        try:
            data = orjson.loads(content)
            vectors = [[float(x) for x in row["values"]] for row in data["embeddings"]]
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            raise ProviderMalformed("the upstream embeddings answer is malformed") from None
        if len(vectors) != len(inputs):
            raise ProviderMalformed("the upstream embedded a different number of inputs")
        meta = data.get("usageMetadata") if isinstance(data, dict) else None
        reported = meta.get("promptTokenCount") if isinstance(meta, dict) else None
        tokens = reported if isinstance(reported, int) else estimate_embedding_tokens(inputs)
        return EmbeddingResult(vectors=vectors, usage=Usage(prompt_tokens=tokens))

    def ignored_parameters(self, body: dict[str, Any]) -> list[str]:
        """The forwarded chat parameters Gemini has no form for."""
        return [name for name in IGNORED if name in body]
