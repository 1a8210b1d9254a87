"""Anthropic's Messages API (``POST {base_url}/v1/messages``), behind OpenAI's shapes.

The body is translated by :mod:`gateway.providers.anthropic_translate` (the decisions are
listed there and in docs/providers/anthropic.md); the I/O is the openai kind's: one
pooled HTTP/1.1 client (:mod:`gateway.providers.http1`), the same failure table
(:mod:`gateway.providers.wire`: Anthropic's 529 ``overloaded_error`` is a server
error like a 5xx), the upstream's error text kept only with every credential this
server holds cut out of it. Each request carries ``x-api-key`` (the provider's key, or
an organisation's own key on a BYOK call) and ``anthropic-version``.

A stream is read event by event as it arrives. Its ``error`` event before any output is
mapped by its error type as the same status would be (``overloaded_error`` as a 529);
after output, it is a dropped call, as an OpenAI upstream's error chunk is. A stream
that ends without ``message_stop`` was cut.

Anthropic has no embeddings API: an embedding call is refused, saying so.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

import orjson

from gateway.observe.tracing import TraceContext
from gateway.providers.anthropic_translate import (
    IGNORED,
    StreamTranslator,
    Untranslatable,
    answer_schema,
    completion,
    messages_request,
    usage_of,
)
from gateway.providers.base import (
    EmbeddingRequest,
    EmbeddingResult,
    MessagesRequest,
    MessagesResult,
    ProviderDropped,
    ProviderError,
    ProviderMalformed,
    ProviderRefused,
    ProviderRequest,
    ProviderResult,
)
from gateway.providers.wire import (
    Caller,
    HTTPProvider,
    StreamProgress,
    json_answer,
    status_error,
    stream_ended,
)

PATH = "/v1/messages"
COUNT_PATH = "/v1/messages/count_tokens"
#: Messages fields that shape only the answer: count_tokens refuses them
NOT_COUNTED = frozenset(
    {"max_tokens", "stream", "stop_sequences", "temperature", "top_p", "top_k", "metadata",
     "service_tier"}
)  # fmt: skip
#: the HTTP status of each error type of Anthropic's (its errors reference)
ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "overloaded_error": 529,
}


class AnthropicProvider(HTTPProvider):
    auth_header = "x-api-key"
    auth_prefix = ""

    def _headers(self, api_key: str | None, trace: TraceContext | None) -> dict[str, str]:
        return {
            **super()._headers(api_key, trace),
            "anthropic-version": self.config.anthropic_version,
        }

    @staticmethod
    def _translated(request: ProviderRequest, stream: bool) -> tuple[dict[str, Any], bool]:
        """The Messages API body, and whether the structured answer's tool is in it."""
        body = {**request.body, "stream": stream}
        try:
            translated = messages_request(body, request.upstream_model)
        except Untranslatable as exc:
            raise ProviderRefused(400, str(exc)) from None
        return translated, answer_schema(body.get("response_format")) is not None

    async def complete(self, request: ProviderRequest) -> ProviderResult:
        body, structured = self._translated(request, stream=False)
        message = await self._message(body, request, {})
        answer = completion(message, request.upstream_model, structured)
        return ProviderResult(completion=answer, usage=usage_of(message.get("usage")))

    async def stream(self, request: ProviderRequest) -> AsyncIterator[dict[str, Any]]:
        body, structured = self._translated(request, stream=True)
        translator = StreamTranslator(request.upstream_model, structured)
        events = self._events(body, request, {})
        async with aclosing(events):
            async for event in events:
                for chunk in translator.feed(event):
                    yield chunk

    async def messages(self, request: MessagesRequest) -> MessagesResult:
        """The caller's Messages body (and betas) passed through: the upstream's message."""
        body = {**request.body, "stream": False}
        message = await self._message(body, request, _betas(request))
        return MessagesResult(message=message, usage=usage_of(message.get("usage")))

    async def count_tokens(self, request: MessagesRequest) -> int:
        """The upstream's count of the input tokens of a Messages body (its answer's
        fields stripped: count_tokens refuses them)."""
        body = {k: v for k, v in request.body.items() if k not in NOT_COUNTED}
        content = await self._post(COUNT_PATH, body, request, _betas(request))
        counted = json_answer(content, "a token count").get("input_tokens")
        if not isinstance(counted, int) or isinstance(counted, bool) or counted < 0:
            raise ProviderMalformed("the upstream answer is not a token count")
        return counted

    async def _message(
        self,
        body: dict[str, Any],
        caller: Caller,
        extra: dict[str, str],
    ) -> dict[str, Any]:
        """The ``message`` of a call without a stream; an unreadable one is malformed."""
        content = await self._post(PATH, body, caller, extra)
        return json_answer(content, "a message", "content")

    async def messages_stream(self, request: MessagesRequest) -> AsyncIterator[dict[str, Any]]:
        """The caller's Messages body (and betas) passed through: the upstream's events."""
        body = {**request.body, "stream": True}
        events = self._events(body, request, _betas(request))
        async with aclosing(events):
            async for event in events:
                yield event

    async def _events(
        self,
        body: dict[str, Any],
        caller: Caller,
        extra: dict[str, str],
    ) -> AsyncGenerator[dict[str, Any], None]:
        """The events of a streamed call as they arrive, up to ``message_stop``; an
        ``error`` event, and a stream that ends early, raised as provider errors. Output
        has started (``produced``) at the first event other than ``ping``."""
        progress = StreamProgress()
        #: an ``error`` event's failure, raised once the stream was read to its end
        failure: ProviderError | None = None
        batches = self._sse(PATH, body, caller, progress, extra)
        async with aclosing(batches):
            async for batch in batches:
                for event in batch:
                    if progress.done:
                        break
                    if not isinstance(event, dict):
                        continue
                    kind = event.get("type")
                    if kind == "error":
                        failure = self._failure(
                            event.get("error"), progress.produced, caller.api_key
                        )
                        progress.done = True
                        continue
                    progress.produced = progress.produced or kind != "ping"
                    yield event
                    if kind == "message_stop":
                        progress.done = True
        if failure is not None:
            raise failure
        if not progress.done:
            raise stream_ended(progress.produced, "without message_stop")

    def _failure(self, error: Any, produced: bool, api_key: str | None) -> ProviderError:
        """The provider error of an ``error`` event (``error``: its error object)."""
        error = error if isinstance(error, dict) else {}
        content = orjson.dumps({"error": {"message": str(error.get("message") or "")}})
        if produced:
            message = status_error(500, content, self._secrets(api_key)).message
            return ProviderDropped(message)
        status = ERROR_STATUS.get(str(error.get("type") or ""), 500)
        return status_error(status, content, self._secrets(api_key))

    async def embed(self, request: EmbeddingRequest) -> EmbeddingResult:
        raise ProviderRefused(
            400,
            "Anthropic has no embeddings API; serve the embedding model from a provider "
            "of another kind (openai, gemini, bedrock or azure).",
        )

    def ignored_parameters(self, body: dict[str, Any]) -> list[str]:
        return [name for name in IGNORED if name in body]


def _betas(request: MessagesRequest) -> dict[str, str]:
    """The ``anthropic-beta`` header of a passed-through call: the caller's values."""
    return {"anthropic-beta": ",".join(request.betas)} if request.betas else {}
