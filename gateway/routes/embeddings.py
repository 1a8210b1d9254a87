"""POST /v1/embeddings: the one served embedding model; every failure counts nothing."""

from __future__ import annotations

import trio
from quart import Quart, Response, request

from gateway.admission import admit
from gateway.auth import authenticate, require_scope
from gateway.calls.embeddings import parse_embeddings
from gateway.calls.tags import collect_tags
from gateway.errors import GatewayError
from gateway.estimate import estimate_embedding_tokens
from gateway.http import json_response, read_json_object, request_id, runtime
from gateway.pipeline import open_call, remaining, reserve_call, resolve
from gateway.policy import check_entitlements
from gateway.provider_errors import map_provider_error
from gateway.providers.base import ProviderError, embedding_response
from gateway.settlement import Ending


async def embeddings() -> Response:
    record = authenticate()
    await require_scope(record, "embeddings")
    rt = runtime()
    try:
        # read whole before step 3 takes an in-flight slot (see routes/chat.py)
        body = await read_json_object()
    except GatewayError:
        await admit(record, take_slot=False)  # refused, and counted like any request
        raise
    call = await open_call(rt, record, request_id(), "embeddings")
    try:
        check_entitlements(rt, record, ["embeddings"])
        call.tags = collect_tags(
            request.headers.get("X-Svc-Tags"), body, record.default_tags, record.required_tags
        )
        named = body.get("model")
        if isinstance(named, str) and rt.catalog.get(named) is None:
            # a model that does not exist is 404 model_not_found (decision unknown_model)
            # on every endpoint; 400 model_not_allowed is for a model of the catalog
            # that is not the served embedding model
            resolve(call, named, "embedding")
        served = rt.catalog.embedding_model()
        parsed = parse_embeddings(body, served.id if served else None)
        model = resolve(call, parsed.model, "embedding")
        if parsed.dimensions is not None and parsed.dimensions > model.config.dimensions:
            raise GatewayError(
                "invalid_request",
                f"dimensions must be at most {model.config.dimensions} for {model.id}.",
                param="dimensions",
            )
        await reserve_call(call, estimate_embedding_tokens(parsed.inputs), 0)
        assert call.provider is not None
        call.calling_provider()
        try:
            with trio.move_on_after(remaining(call)) as scope:
                result = await call.provider.embed(
                    model.config.upstream_id,
                    parsed.inputs,
                    parsed.dimensions,
                    rt.provider_key(record, model),
                    call.exchange.trace if call.exchange else None,
                )
        except ProviderError as exc:
            # on embeddings every failure releases the reservation and counts nothing
            error, _ = map_provider_error(exc, byok=record.byok)
            await call.finish(
                Ending.PROVIDER_REFUSED, http_status=error.status, error_code=error.code
            )
            raise error from None
        if scope.cancelled_caught:
            await call.finish(
                Ending.PROVIDER_REFUSED, http_status=504, error_code="request_timeout"
            )
            raise GatewayError("request_timeout", "The call ran out of time.")
        await call.finish(Ending.USAGE, usage=result.usage)
        answer = embedding_response(result, model.id, parsed.encoding_format)
        # the svc block of every successful call; no forwarded parameter is ignored here
        # (fields other than model, input, encoding_format, dimensions are not forwarded)
        answer["svc"] = {"request_id": call.request_id, "ignored_parameters": []}
        return json_response(answer)
    except Exception as exc:
        if call.provider_called and not isinstance(exc, GatewayError):
            # a fault of ours (answered 500 internal_error): recorded, counts nothing
            await call.finish(Ending.PROVIDER_REFUSED, http_status=500, error_code="internal_error")
        raise
    finally:
        # a cancelled or refused embeddings call counts nothing either
        await call.finish(Ending.NOT_CALLED)


def register(app: Quart) -> None:
    app.add_url_rule("/v1/embeddings", "embeddings", embeddings, methods=["POST"])
