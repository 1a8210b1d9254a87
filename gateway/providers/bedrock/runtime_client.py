"""The ``bedrock`` provider: Converse and ConverseStream calls over our HTTP/1.1 pool.

``POST {base_url}/model/{modelId}/converse`` (``/converse-stream``), ``modelId`` (the
model's ``upstream_id``: a model id, an inference profile id or an ARN) percent-encoded
whole. Each call is signed anew (:mod:`.aws_auth`); the answer is read by
:mod:`.converse` or, streamed, :mod:`.converse_stream`.

Failures, on top of :mod:`gateway.providers.wire`'s table (an AWS error is
``{"message": ...}`` with its type in the ``x-amzn-ErrorType`` header):

    AWS answer                                        raised
    ------------------------------------------------  ----------------------------------
    ThrottlingException (429),                        ProviderRateLimited
      ServiceQuotaExceededException (400)
    ModelNotReadyException (429)                      ProviderServerError(503)
    ModelTimeoutException (408)                       ProviderTimedOut
    ValidationException 400, AccessDenied 403,        ProviderRefused(status)
      ResourceNotFound 404, UnrecognizedClient 403
    InternalServer 500, ServiceUnavailable 503, ...   ProviderServerError(status)
    an exception frame mid-stream, output started     ProviderDropped
    an exception frame before any output              as its HTTP twin above (throttling:
                                                      rate limited, validation: refused,
                                                      the others: server error)
    the stream ends before messageStop                ProviderDropped (output started),
                                                      else ProviderUnreachable

Every error text is cut of the call's credentials, the provider's own, every other
secret the server holds and any signature or security token it quotes
(:func:`.aws_auth.redact_aws`) before it goes further.
"""

from __future__ import annotations

import secrets as token_source
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import aclosing
from typing import Any
from urllib.parse import quote, urlsplit

import orjson

from gateway.config.settings import ProviderConfig
from gateway.observe.tracing import TraceContext
from gateway.providers.base import (
    EmbeddingRequest,
    EmbeddingResult,
    ProviderDropped,
    ProviderError,
    ProviderRateLimited,
    ProviderRefused,
    ProviderRequest,
    ProviderResult,
    ProviderServerError,
    ProviderTimedOut,
)
from gateway.providers.bedrock import converse
from gateway.providers.bedrock.aws_auth import (
    AWSCredentials,
    credentials_for,
    own_credentials,
    redact_aws,
    signed_headers,
)
from gateway.providers.bedrock.converse_stream import ChunkReader, StreamException
from gateway.providers.http1 import HTTPFailure, Response
from gateway.providers.wire import (
    error_for_status,
    exchange,
    json_answer,
    pool_for,
    stream_ended,
    stream_failure,
)

EVENT_STREAM = "application/vnd.amazon.eventstream"
_RATE_LIMITS = frozenset({"ThrottlingException", "ServiceQuotaExceededException"})
#: exception frames of a stream → the status of their HTTP twin
_STREAM_STATUSES = {
    "throttlingException": 429,
    "validationException": 400,
    "serviceUnavailableException": 503,
    "internalServerException": 500,
    "modelStreamErrorException": 500,
}


class BedrockProvider:
    def __init__(
        self, config: ProviderConfig, secrets: Callable[[], Iterable[str]] = tuple
    ) -> None:
        """``secrets``: every credential the server holds now, cut out of error text."""
        assert config.base_url is not None and config.region is not None
        self.config = config
        self.region = config.region
        self.secrets = secrets
        parts = urlsplit(config.base_url)
        #: what a signed URL starts with: base_url's scheme, host (as sent) and path
        self.pool = pool_for(config)
        self._origin = f"{parts.scheme}://{self.pool.host_header}{parts.path.rstrip('/')}"

    # -- one call ---------------------------------------------------------------------------

    def _signed(
        self,
        path: str,
        body: bytes,
        credentials: AWSCredentials,
        accept: str,
        trace: TraceContext | None,
    ) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": accept}
        headers = signed_headers(credentials, self.region, self._origin + path, body, headers)
        if trace is not None:
            headers.update(trace.headers())  # not signed: AWS accepts unsigned extra headers
        return headers

    def _secrets(self, request: ProviderRequest) -> list[str]:
        held = [*self.secrets(), *([request.api_key] if request.api_key else [])]
        own = own_credentials(self.config)
        return held + (own.secrets() if own is not None else [])

    def _prepare(
        self, request: ProviderRequest, action: str
    ) -> tuple[converse.ConverseCall, str, bytes, AWSCredentials]:
        """The Converse call, its path and body, and its credentials; refusals first."""
        call = converse.converse_request(request.body)
        credentials = credentials_for(self.config, request.api_key)
        path = f"/model/{quote(request.upstream_model, safe='')}/{action}"
        return call, path, orjson.dumps(call.body), credentials

    def _identity(self, request: ProviderRequest) -> dict[str, Any]:
        call_id = request.request_id.removeprefix("req_") or token_source.token_hex(12)
        return {
            "completion_id": f"chatcmpl-{call_id}",
            "model": request.upstream_model,
            "created": int(time.time()),
        }

    async def complete(self, request: ProviderRequest) -> ProviderResult:
        call, path, body, credentials = self._prepare(request, "converse")
        headers = self._signed(path, body, credentials, "application/json", request.trace)
        response, content = await exchange(self.pool, path, headers, body)
        if response.status != 200:
            raise _status_error(response, content, self._secrets(request))
        answer = json_answer(content, "an object")
        completion, usage = converse.completion(
            answer, **self._identity(request), answer_tool=call.answer_tool
        )
        return ProviderResult(completion=completion, usage=usage)

    async def stream(self, request: ProviderRequest) -> AsyncIterator[dict[str, Any]]:
        call, path, body, credentials = self._prepare(request, "converse-stream")
        headers = self._signed(path, body, credentials, EVENT_STREAM, request.trace)
        reader = ChunkReader(**self._identity(request), answer_tool=call.answer_tool)
        produced = False
        response: Response | None = None
        try:
            response = await self.pool.post(path, headers, body)
            if response.status != 200:
                content = await response.read()
                raise _status_error(response, content, self._secrets(request))
            async with aclosing(response.iter_body()) as pieces:  # left early on an exception
                async for piece in pieces:
                    for chunk in reader.feed(piece):
                        produced = True
                        yield chunk
        except HTTPFailure as exc:
            if reader.stopped and reader.usage is not None:
                return  # the whole answer and its usage came: the rest is not ours
            error = stream_failure(exc, produced)
            error.usage = reader.usage
            raise error from None
        except StreamException as exc:
            message = redact_aws(exc.message, self._secrets(request))
            raise _stream_error(exc.kind, message, produced, reader) from None
        finally:
            if response is not None:
                await response.aclose()
        if not reader.stopped:
            raise stream_ended(produced, "before messageStop", reader.usage)

    async def embed(self, request: EmbeddingRequest) -> EmbeddingResult:
        raise ProviderRefused(
            400, "a bedrock provider serves chat models (Converse) only, not embeddings"
        )

    def ignored_parameters(self, body: dict[str, Any]) -> list[str]:
        return converse.ignored_parameters(body)

    async def aclose(self) -> None:
        await self.pool.aclose()


def _status_error(response: Response, content: bytes, secrets: list[str]) -> ProviderError:
    """The provider error of an AWS error answer (its text cut of every secret)."""
    kind = response.headers.get(b"x-amzn-errortype", b"").decode("latin-1").split(":")[0]
    try:
        body = orjson.loads(content)
        text = body.get("message") or body.get("Message") if isinstance(body, dict) else None
    except orjson.JSONDecodeError:
        text = None
    if not isinstance(text, str):
        text = content.decode("utf-8", "replace")
    message = redact_aws(f"{kind}: {text}" if kind else text, secrets)[:500]
    if kind in _RATE_LIMITS:
        return ProviderRateLimited(message)
    if kind == "ModelNotReadyException":
        return ProviderServerError(503, message)
    if kind == "ModelTimeoutException" or response.status == 408:
        return ProviderTimedOut(message)
    return error_for_status(response.status, message)


def _stream_error(kind: str, message: str, produced: bool, reader: ChunkReader) -> ProviderError:
    """An exception frame: a drop once output started, else its HTTP twin's error."""
    text = f"{kind}: {message}"
    if produced:
        return ProviderDropped(text, usage=reader.usage)
    error = error_for_status(_STREAM_STATUSES.get(kind, 500), text)
    error.usage = reader.usage
    return error
