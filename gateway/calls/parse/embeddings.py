"""POST /v1/embeddings: model, input, encoding_format, dimensions; every other field is
ignored without error (metadata and svc_tags still carry tags: the tag step reads them).

Precedence: the body is an object, then ``model`` (invalid_request when absent or not a
string, 400 model_not_allowed when it is not the one served embedding model), then
``input``, ``encoding_format``, ``dimensions`` (invalid_request, param naming the field).
A model that is not in the catalog at all is answered before this parse by the route:
404 model_not_found, as on every endpoint.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gateway.accounts.catalog import Model
from gateway.accounts.key_fields import as_int
from gateway.calls.parse import EmbeddingCall
from gateway.calls.parse.fields import invalid, positive_int, require_object
from gateway.errors import ErrorSpec, GatewayError


class EmbeddingModelNotAllowed(GatewayError):
    """model_not_allowed with the status of the spec's 400 table row for /v1/embeddings
    (the catalog's row, 403, is the policy refusal of the inference endpoints)."""

    @property
    def spec(self) -> ErrorSpec:
        return replace(super().spec, status=400)


def parse_embeddings(body: Any, served_model_id: str | None) -> EmbeddingCall:
    """Validate an embeddings body; ``served_model_id`` is None when no model is served.

    A null field is the same as an absent one (encoding_format null is float).
    """
    body = require_object(body)
    model = body.get("model")
    if not isinstance(model, str):
        raise invalid("model", "model is required and must be a string.")
    if model != served_model_id:
        message = (
            f"Only the served embedding model, {served_model_id}, is accepted."
            if served_model_id is not None
            else "No embedding model is served here."
        )
        raise EmbeddingModelNotAllowed("model_not_allowed", message, param="model")
    inputs = _inputs(body.get("input"))
    encoding = body.get("encoding_format")
    if encoding not in (None, "float", "base64"):
        raise invalid("encoding_format", "encoding_format must be float or base64.")
    return EmbeddingCall(
        model=model,
        inputs=inputs,
        encoding_format="base64" if encoding == "base64" else "float",
        dimensions=positive_int(body, "dimensions"),
    )


def _inputs(value: Any) -> list[str] | list[list[int]]:
    """A string, strings, one token array, or token arrays; nothing empty."""
    if isinstance(value, str) and value:
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(item, str) and item for item in value):
            return value
        one = _tokens(value)
        if one is not None:
            return [one]
        many = [_tokens(item) if isinstance(item, list) else None for item in value]
        if all(many):
            return [tokens for tokens in many if tokens]
    raise invalid(
        "input",
        "input must be a non-empty string, an array of strings, or token arrays of integers.",
    )


def _tokens(values: list[Any]) -> list[int] | None:
    """A non-empty token array as integers (``7.0`` is 7), or None."""
    tokens = [as_int(value) for value in values]
    if not tokens or any(token is None or token < 0 for token in tokens):
        return None
    return [token for token in tokens if token is not None]


def check_dimensions(call: EmbeddingCall, model: Model) -> None:
    """Once the model is resolved: the dimensions asked for are at most its own."""
    if call.dimensions is not None and call.dimensions > model.config.dimensions:
        raise invalid(
            "dimensions", f"dimensions must be at most {model.config.dimensions} for {model.id}."
        )
