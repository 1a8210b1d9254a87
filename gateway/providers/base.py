"""The provider interface: what every model provider (mock, OpenAI-compatible HTTP, ...) offers.

A provider speaks OpenAI's shapes on both sides: it takes an OpenAI chat-completions
request body and answers with a ``chat.completion`` object, or a stream of
``chat.completion.chunk`` objects whose last chunk carries ``usage`` and empty
``choices`` (OpenAI's ``stream_options.include_usage``). The gateway adds its own
``svc`` block and settles the reservation from :class:`Usage`.

Every failure of a provider is one of these exceptions; the gateway maps each to the
spec's error code and settlement row, and nothing else from a provider may escape::

    ProviderError                 any failure; .usage is set when the provider reported usage
    ├── ProviderRefused           400/401/403/404/413/422 before any work (.status, .message)
    ├── ProviderRateLimited       429 before anything was produced
    ├── ProviderServerError       5xx (.status)
    ├── ProviderUnreachable       connect error or reset before any output
    ├── ProviderDropped           connection lost mid-stream, after output started
    ├── ProviderTimedOut          the provider's own ``timeout_s`` passed, request sent
    └── ProviderMalformed         a 200 answer that cannot be read as one

The gateway owns the call's time limit (its own 504) and cancels the provider call;
a provider's ``timeout_s`` shorter than that limit ends the call the same way.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from gateway.observe.tracing import TraceContext


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts as the provider reported them; ``total_tokens`` left at 0 is the sum.

    ``prompt_tokens`` counts every input token, as OpenAI's ``prompt_tokens`` does:
    ``cached_tokens`` (read from the provider's prompt cache) and ``cache_write_tokens``
    (written to it) are parts of it, priced at the model's cache prices; the rest is
    priced as input. A provider whose report counts them apart (Anthropic's
    ``input_tokens`` excludes both) adds them in.
    """

    prompt_tokens: int
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0

    def __post_init__(self) -> None:
        if not self.total_tokens:
            object.__setattr__(self, "total_tokens", self.prompt_tokens + self.completion_tokens)

    @classmethod
    def reported(cls, data: Any) -> Usage | None:
        """The usage an OpenAI-shaped ``usage`` object reports; None when it is not one.

        Cache counts are in ``prompt_tokens_details``: ``cached_tokens`` (OpenAI's) and
        ``cache_write_tokens`` (OpenRouter's name, and how the native kinds pass theirs
        on through a stream's usage chunk). A detail that is not a count reads as 0: the
        usage stays reported, the tokens priced as plain input.
        """
        if not isinstance(data, dict):
            return None
        try:
            details = data.get("prompt_tokens_details")
            details = details if isinstance(details, dict) else {}
            return cls(
                prompt_tokens=int(data.get("prompt_tokens") or 0),
                completion_tokens=int(data.get("completion_tokens") or 0),
                cached_tokens=_detail(details, "cached_tokens"),
                cache_write_tokens=_detail(details, "cache_write_tokens"),
            )
        except (TypeError, ValueError):
            return None

    def as_dict(self) -> dict[str, Any]:
        """OpenAI's ``usage`` object of a chat completion: cached tokens in
        ``prompt_tokens_details``, as OpenAI reports them, and cache-written tokens
        beside them (``cache_write_tokens``), when there are any."""
        usage: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
        }
        if self.cached_tokens or self.cache_write_tokens:
            details = {"cached_tokens": self.cached_tokens}
            if self.cache_write_tokens:
                details["cache_write_tokens"] = self.cache_write_tokens
            usage["prompt_tokens_details"] = details
        return usage


def _detail(details: dict[str, Any], name: str) -> int:
    """One count of ``prompt_tokens_details``; 0 when absent or not a count."""
    value = details.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0
    return int(value)


@dataclass(frozen=True, slots=True)
class ProviderRequest:
    """One chat call: the OpenAI body, sent upstream with ``model`` = ``upstream_model``.

    ``request_id`` is the gateway's id of the call (``req_<hex>``), from which the mock
    derives its per-call answer ids.
    """

    upstream_model: str
    body: dict[str, Any]
    api_key: str | None = None
    #: the call's W3C trace, sent upstream as ``traceparent`` (and ``tracestate``)
    trace: TraceContext | None = None
    request_id: str = ""


@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    """One embeddings call: each input (a string or a token array) sent upstream with
    ``model`` = ``upstream_model``; ``None`` dimensions: the model's own."""

    upstream_model: str
    inputs: list[Any]
    dimensions: int | None = None
    api_key: str | None = None
    #: the call's W3C trace, sent upstream as ``traceparent`` (and ``tracestate``)
    trace: TraceContext | None = None


@dataclass(frozen=True, slots=True)
class ProviderResult:
    completion: dict[str, Any]
    usage: Usage | None


@dataclass(frozen=True, slots=True)
class EmbeddingResult:
    vectors: list[list[float]]
    usage: Usage


class Provider(Protocol):
    async def complete(self, request: ProviderRequest) -> ProviderResult:
        """A non-streamed chat completion."""
        ...

    def stream(self, request: ProviderRequest) -> AsyncIterator[dict[str, Any]]:
        """Yield ``chat.completion.chunk`` dicts; the last carries ``usage`` when reported."""
        ...

    async def embed(self, request: EmbeddingRequest) -> EmbeddingResult:
        """Embed each input of the request."""
        ...

    def ignored_parameters(self, body: dict[str, Any]) -> list[str]:
        """Chat-completions names of the parameters of ``body`` this provider ignores."""
        ...


@dataclass(frozen=True, slots=True)
class MessagesRequest:
    """One Anthropic Messages API call passed through in Anthropic's own shape (a
    ``/v1/messages`` call attempted on a deployment that speaks it): ``body`` is the
    caller's, with ``model`` already the upstream id; ``betas`` the ``anthropic-beta``
    values the caller sent, forwarded as they are."""

    body: dict[str, Any]
    betas: tuple[str, ...] = ()
    api_key: str | None = None
    #: the call's W3C trace, sent upstream as ``traceparent`` (and ``tracestate``)
    trace: TraceContext | None = None


@dataclass(frozen=True, slots=True)
class MessagesResult:
    """A Messages API answer as the upstream sent it, and the usage it reports."""

    message: dict[str, Any]
    usage: Usage | None


@runtime_checkable
class NativeMessages(Protocol):
    """A provider that serves Anthropic's Messages API natively (kind ``anthropic``):
    the gateway's ``/v1/messages`` is passed through to it, per attempt, rather than
    translated to a chat call. Failures are the same :class:`ProviderError` tree."""

    async def messages(self, request: MessagesRequest) -> MessagesResult:
        """A non-streamed Messages call: the upstream's ``message``."""
        ...

    def messages_stream(self, request: MessagesRequest) -> AsyncIterator[dict[str, Any]]:
        """Yield the upstream's stream events as they come (``ping`` included), up to
        ``message_stop``; an ``error`` event is raised as its provider error."""
        ...

    async def count_tokens(self, request: MessagesRequest) -> int:
        """The upstream's input-token count of the body (``/v1/messages/count_tokens``)."""
        ...


def native_messages(provider: Provider) -> NativeMessages | None:
    """``provider`` when it serves the Messages API natively, else None (the call is
    translated to a chat call)."""
    return provider if isinstance(provider, NativeMessages) else None


class ProviderError(Exception):
    """A provider call failed; ``usage`` is what the provider reported, if anything."""

    def __init__(self, message: str = "", *, usage: Usage | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.usage = usage


class ProviderRefused(ProviderError):
    """The provider refused the request as written (or its credential) before any work."""

    def __init__(self, status: int, message: str, *, usage: Usage | None = None) -> None:
        super().__init__(message, usage=usage)
        self.status = status


class ProviderRateLimited(ProviderError):
    """The provider answered 429 before anything was produced; ``retry_after``: the
    seconds its Retry-After header asked for (None: none, or unreadable)."""

    retry_after: float | None = None


class ProviderServerError(ProviderError):
    """The provider answered with a 5xx status."""

    def __init__(self, status: int, message: str = "", *, usage: Usage | None = None) -> None:
        super().__init__(message, usage=usage)
        self.status = status


class ProviderUnreachable(ProviderError):
    """No answer: the connection failed or was reset before any output."""


class ProviderDropped(ProviderError):
    """The connection was lost mid-stream, after output had started."""


class ProviderTimedOut(ProviderError):
    """The provider's own time limit (``timeout_s``) passed while its answer was awaited.

    The request was sent, so the provider may have worked: the same settlement as the
    gateway's own deadline (the full estimate), not a lost connection's input share.
    """


class ProviderMalformed(ProviderError):
    """The provider answered 200 with a body that is not a readable answer.

    A 200 says the work was done: the full estimate, as for another provider status.
    """


def embedding_response(
    result: EmbeddingResult, model: str, encoding_format: Literal["float", "base64"] = "float"
) -> dict[str, Any]:
    """OpenAI's ``CreateEmbeddingResponse`` for ``result``.

    ``base64`` is what OpenAI sends (and what its client asks for by default): the
    vector as little-endian float32 bytes, base64-encoded.
    """
    data = [
        {
            "object": "embedding",
            "index": index,
            "embedding": _base64_floats(vector) if encoding_format == "base64" else vector,
        }
        for index, vector in enumerate(result.vectors)
    ]
    usage = {"prompt_tokens": result.usage.prompt_tokens, "total_tokens": result.usage.total_tokens}
    return {"object": "list", "data": data, "model": model, "usage": usage}


def _base64_floats(vector: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
