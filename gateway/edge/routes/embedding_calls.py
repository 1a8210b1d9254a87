"""POST /v1/embeddings: the one served embedding model; every failure counts nothing."""

from __future__ import annotations

from quart import Quart, Response

from gateway.calls import pipeline
from gateway.calls.lifecycle import Call
from gateway.calls.parse import EmbeddingCall
from gateway.calls.pipeline import EMBEDDINGS, Endpoint
from gateway.edge.http import call_answer
from gateway.edge.routes.model_calls import serve_call


async def _embed(call: Call, _: Endpoint, parsed: EmbeddingCall) -> Response:
    return call_answer(await pipeline.embed(call, parsed))


async def embeddings() -> Response:
    return await serve_call(EMBEDDINGS, _embed)


def register(app: Quart) -> None:
    app.add_url_rule("/v1/embeddings", "embeddings", embeddings, methods=["POST"])
