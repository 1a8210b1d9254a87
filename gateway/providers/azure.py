"""Azure OpenAI: OpenAI's wire format at Azure's addresses, with Azure's key header.

The body, the answers, the stream and the error bodies are OpenAI's, so this is the
``openai`` kind (:mod:`gateway.providers.openai`) with three things of its own:

- **Addressing.** With ``api_version`` set, the deployments surface:
  ``POST {base_url}/openai/deployments/{upstream_id}/chat/completions?api-version=…``
  (and ``…/embeddings?api-version=…``); the model's ``upstream_id`` names the deployment.
  The body keeps ``model`` (Azure ignores it there, and Azure's own SDK sends it too).
  Without ``api_version``, the v1 surface: ``{base_url}/openai/v1/chat/completions`` and
  ``…/embeddings``, with ``model`` = the deployment name, as Azure's v1 API wants.
- **The key** goes in ``api-key``, never in ``Authorization`` (Azure reads a Bearer
  token as a Microsoft Entra token and refuses a resource key there).
- **Azure's additions are left out**, so a client sees what an ``openai`` upstream
  gives: the stream's chunks that carry only ``prompt_filter_results`` (Azure's first
  chunk, ``choices`` empty, before any output) are not passed on and are not output (a
  connection lost after them settles as lost before any output), nor are the
  asynchronous filter's chunks of annotations only (choices without a ``delta``);
  ``prompt_filter_results`` and each choice's ``content_filter_results`` and
  ``content_filter_offsets`` are dropped from answers and chunks.

Refusals: a 400 whose error code is ``content_filter`` (the prompt tripped Azure's
content filter) is a provider refusal like any 400 (400 ``invalid_request``, nothing
settled), its explanation starting "Azure's content filter refused the prompt" so the
client knows to change the prompt rather than the request's form. An answer filtered on
the way out is a 200 with ``finish_reason`` ``content_filter``, passed on as it is.
A 429 is the provider limiting the model: Azure's ``retry-after`` / ``retry-after-ms``
hints are not passed on, the answer carries the spec's Retry-After (30 s).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import orjson

from gateway.providers.base import ProviderError, ProviderRefused, ProviderRequest, ProviderResult
from gateway.providers.openai import OpenAIProvider

#: what Azure adds to OpenAI's answers and chunks
_FILTER_RESULTS = "prompt_filter_results"
#: a choice's filter annotations (``content_filter_offsets``: the asynchronous filter's)
_CHOICE_FILTER_KEYS = frozenset({"content_filter_results", "content_filter_offsets"})
CONTENT_FILTER_PHRASE = "Azure's content filter refused the prompt"


class AzureProvider(OpenAIProvider):
    auth_header = "api-key"
    auth_prefix = ""

    def _path(self, operation: str, upstream_model: str) -> str:
        version = self.config.api_version
        if version is None:
            return f"/openai/v1/{operation}"
        deployment = quote(upstream_model, safe="")
        return f"/openai/deployments/{deployment}/{operation}?api-version={quote(version, safe='')}"

    def _passed_on(self, chunk: dict[str, Any]) -> dict[str, Any] | None:
        """Without Azure's annotations; None for a chunk that is nothing else: the
        prompt's filter results, or (the asynchronous filter) choices with no delta."""
        if chunk.get("usage"):
            return _without_filter_results(chunk)
        choices = chunk.get("choices")
        if not choices:
            return None if _FILTER_RESULTS in chunk else chunk
        if isinstance(choices, list) and all(
            isinstance(c, dict) and "delta" not in c and c.get("finish_reason") is None
            for c in choices
        ):
            return None
        return _without_filter_results(chunk)

    def _status_error(self, status: int, content: bytes, api_key: str | None) -> ProviderError:
        error = super()._status_error(status, content, api_key)
        if isinstance(error, ProviderRefused) and _error_code(content) == "content_filter":
            message = f"{CONTENT_FILTER_PHRASE}: {error.message}"
            return ProviderRefused(error.status, message, usage=error.usage)
        return error

    async def complete(self, request: ProviderRequest) -> ProviderResult:
        result = await super().complete(request)
        return ProviderResult(_without_filter_results(result.completion), result.usage)


def _without_filter_results(answer: dict[str, Any]) -> dict[str, Any]:
    if _FILTER_RESULTS in answer:
        answer = {k: v for k, v in answer.items() if k != _FILTER_RESULTS}
    choices = answer.get("choices")
    if isinstance(choices, list) and any(
        isinstance(c, dict) and not _CHOICE_FILTER_KEYS.isdisjoint(c) for c in choices
    ):
        answer["choices"] = [
            {k: v for k, v in c.items() if k not in _CHOICE_FILTER_KEYS}
            if isinstance(c, dict)
            else c
            for c in choices
        ]
    return answer


def _error_code(content: bytes) -> str | None:
    """``error.code`` of an OpenAI-shaped error body."""
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None
