"""POST /v1/messages/count_tokens: the input tokens of a Messages body.

A live key on a model whose first deployment speaks the Messages API (``anthropic``)
gets the upstream's own count, asked within :data:`COUNT_TIMEOUT_S`; otherwise, or when
the upstream fails or is slow, the gateway's bound of the prompt with the model's
``tokenizer`` (:func:`gateway.calls.tokens.count_prompt`, the one a reservation counts).
"""

from __future__ import annotations

import logging

import trio

from gateway.accounts.catalog import Model
from gateway.accounts.key_record import KeyRecord
from gateway.calls.lifecycle import CallParts
from gateway.calls.parse import ChatCall
from gateway.calls.tokens import count_prompt
from gateway.errors import GatewayError
from gateway.providers.base import MessagesRequest, ProviderError, native_messages

#: how long count_tokens waits for an upstream's count before answering the estimate
COUNT_TIMEOUT_S = 5.0

log = logging.getLogger("gateway.calls.counting")


async def count_input_tokens(
    parts: CallParts, record: KeyRecord, model: Model, call: ChatCall, betas: tuple[str, ...]
) -> int:
    """The upstream's count where one can answer, else the gateway's bound."""
    counted = await _upstream_count(parts, record, model, call, betas)
    return await count_prompt(call, model.config) if counted is None else counted


async def _upstream_count(
    parts: CallParts, record: KeyRecord, model: Model, call: ChatCall, betas: tuple[str, ...]
) -> int | None:
    """The count of a deployment that speaks the Messages API, within the time limit;
    None: none does (or the key is a sandbox one), or it failed."""
    try:
        provider = native_messages(parts.provider_for(record, model))
    except GatewayError:  # a live key on a model only the mock serves: the estimate
        return None
    if provider is None or call.native is None:
        return None
    asked = MessagesRequest(
        body={**call.native.body, "model": model.config.upstream_id},
        betas=betas,
        api_key=parts.provider_key(record, model),
    )
    with trio.move_on_after(COUNT_TIMEOUT_S):
        try:
            return await provider.count_tokens(asked)
        except ProviderError as exc:
            log.info("count_tokens upstream failed, the estimate answers: %s", type(exc).__name__)
    return None
