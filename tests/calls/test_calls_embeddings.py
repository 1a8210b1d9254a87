"""POST /v1/embeddings body rules: model, input, encoding_format, dimensions; all else ignored."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.calls.parse import EmbeddingCall
from gateway.calls.parse.embeddings import parse_embeddings
from gateway.errors import GatewayError, render

SERVED = "text-embedding-3-small"


def body(**fields: Any) -> dict[str, Any]:
    return {"model": SERVED, "input": "hello", **fields}


# (case, body, served model, code, param, status)
REFUSALS: list[tuple[str, Any, str | None, str, str | None, int]] = [
    ("body not an object", ["hello"], SERVED, "invalid_request", None, 400),
    ("model missing", {"input": "hello"}, SERVED, "invalid_request", "model", 400),
    ("model not a string", body(model=1), SERVED, "invalid_request", "model", 400),
    ("another model", body(model="gpt-4o-mini"), SERVED, "model_not_allowed", "model", 400),
    ("no embedding model served", body(), None, "model_not_allowed", "model", 400),
    ("input missing", {"model": SERVED}, SERVED, "invalid_request", "input", 400),
    ("input empty string", body(input=""), SERVED, "invalid_request", "input", 400),
    ("input empty array", body(input=[]), SERVED, "invalid_request", "input", 400),
    ("input a number", body(input=5), SERVED, "invalid_request", "input", 400),
    ("input an object", body(input={"text": "x"}), SERVED, "invalid_request", "input", 400),
    ("input with an empty string", body(input=["a", ""]), SERVED, "invalid_request", "input", 400),
    ("input mixed strings and ints", body(input=["a", 1]), SERVED, "invalid_request", "input",
     400),
    ("token array with a float", body(input=[1, 2.5]), SERVED, "invalid_request", "input", 400),
    ("token array with a negative", body(input=[1, -2]), SERVED, "invalid_request", "input", 400),
    ("token array with a boolean", body(input=[1, True]), SERVED, "invalid_request", "input",
     400),
    ("empty token array in a list", body(input=[[1], []]), SERVED, "invalid_request", "input",
     400),
    ("encoding_format unknown", body(encoding_format="int8"), SERVED, "invalid_request",
     "encoding_format", 400),
    ("encoding_format not a string", body(encoding_format=["float"]), SERVED, "invalid_request",
     "encoding_format", 400),
    ("dimensions zero", body(dimensions=0), SERVED, "invalid_request", "dimensions", 400),
    ("dimensions a string", body(dimensions="256"), SERVED, "invalid_request", "dimensions", 400),
    ("dimensions a boolean", body(dimensions=True), SERVED, "invalid_request", "dimensions", 400),
]  # fmt: skip


@pytest.mark.parametrize(
    ("payload", "served", "code", "param", "status"),
    [row[1:] for row in REFUSALS],
    ids=[row[0] for row in REFUSALS],
)
def test_refusals(payload: Any, served: str | None, code: str, param: str | None,
                  status: int) -> None:  # fmt: skip
    with pytest.raises(GatewayError) as caught:
        parse_embeddings(payload, served)
    assert (caught.value.code, caught.value.param, caught.value.status) == (code, param, status)


def test_model_not_allowed_renders_as_a_400() -> None:
    with pytest.raises(GatewayError) as caught:
        parse_embeddings(body(model="other"), SERVED)
    payload, status, _ = render(caught.value)
    assert status == 400
    assert b'"type":"invalid_request_error"' in payload
    assert b'"code":"model_not_allowed"' in payload


@pytest.mark.parametrize(
    ("value", "inputs"),
    [
        ("hello", ["hello"]),
        (["a", "b"], ["a", "b"]),
        ([1, 2, 3], [[1, 2, 3]]),
        ([[1, 2], [3]], [[1, 2], [3]]),
        ([0], [[0]]),
        ([1.0, 2], [[1, 2]]),  # a zero fraction is the integer it names
        ([[7.0], [3]], [[7], [3]]),
    ],
)
def test_input_forms(value: Any, inputs: list[Any]) -> None:
    read = parse_embeddings(body(input=value), SERVED).inputs
    assert read == inputs
    tokens = [token for item in read if isinstance(item, list) for token in item]
    assert all(type(token) is int for token in tokens)


def test_defaults() -> None:
    assert parse_embeddings(body(), SERVED) == EmbeddingCall(
        model=SERVED, inputs=["hello"], encoding_format="float", dimensions=None
    )


def test_encoding_and_dimensions() -> None:
    call = parse_embeddings(body(encoding_format="base64", dimensions=256), SERVED)
    assert (call.encoding_format, call.dimensions) == ("base64", 256)
    assert parse_embeddings(body(encoding_format=None), SERVED).encoding_format == "float"


@pytest.mark.parametrize(
    "extra",
    [
        {"user": "u"},
        {"metadata": {"team": "a"}},
        {"svc_tags": {"team": "a"}},
        {"frobnicate": [1, 2]},
        {"stream": True},
        {"temperature": 99},
    ],
)
def test_any_other_field_is_ignored(extra: dict[str, Any]) -> None:
    assert parse_embeddings(body(**extra), SERVED) == parse_embeddings(body(), SERVED)
