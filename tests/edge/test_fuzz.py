"""A bounded fuzzing run generated from the OpenAPI document, against a real server process.

Requests are drawn per documented operation: bodies from the operation's request schema
(hypothesis-jsonschema), mangled variants of them, arbitrary JSON and raw bytes; random
headers (a valid key or not, Idempotency-Key, X-Svc-Tags), query strings, path
parameters, and methods. Properties: no answer is a 5xx, every error answer has the
spec's shape with a code of the catalog at the catalog's status, and the server is
still serving at the end. Bounded: a few hundred requests per operation, well under a
minute on 2 cores.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.config.settings import default_config
from gateway.edge.openapi import ALSO_AT, document
from gateway.errors import CATALOG, error_type
from tests.support.procs import Server

pytestmark = pytest.mark.processes

EXAMPLES = 120
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
OPERATIONS = [
    (method, path, op) for path, ops in document()["paths"].items() for method, op in ops.items()
]


def inline(schema: Any, schemas: dict[str, Any]) -> Any:
    """The schema with every components $ref replaced by its target (ours have no cycles)."""
    if isinstance(schema, dict):
        if "$ref" in schema:
            return inline(schemas[schema["$ref"].rsplit("/", 1)[1]], schemas)
        return {k: inline(v, schemas) for k, v in schema.items()}
    if isinstance(schema, list):
        return [inline(v, schemas) for v in schema]
    return schema


def from_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values of the JSON-schema subset our document uses (mostly valid ones: the bounds
    are honoured, required members always present, optional ones drawn at random)."""
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "oneOf" in schema:
        return st.one_of([from_schema(s) for s in schema["oneOf"]])
    if "allOf" in schema:
        parts = [from_schema(s) for s in schema["allOf"]]
        return st.tuples(*parts).map(lambda ds: {k: v for d in ds for k, v in d.items()})
    kinds = schema.get("type", "object")
    if isinstance(kinds, list):
        return st.one_of([from_schema({**schema, "type": kind}) for kind in kinds])
    if kinds == "object":
        props = {
            k: MODEL_NAMES if k == "model" else from_schema(v)
            for k, v in schema.get("properties", {}).items()
        }
        required = set(schema.get("required", ()))
        extra = schema.get("additionalProperties")
        base = st.fixed_dictionaries(
            {k: v for k, v in props.items() if k in required},
            optional={k: v for k, v in props.items() if k not in required},
        )
        if isinstance(extra, dict):
            more = st.dictionaries(st.text(max_size=8), from_schema(extra), max_size=3)
            return st.tuples(base, more).map(lambda pair: {**pair[1], **pair[0]})
        return base
    if kinds == "array":
        items = from_schema(schema["items"]) if "items" in schema else JSON_VALUES
        return st.lists(
            items, min_size=schema.get("minItems", 0), max_size=schema.get("maxItems", 4)
        )
    if kinds == "string":
        return st.text(min_size=schema.get("minLength", 0), max_size=schema.get("maxLength", 30))
    if kinds == "integer":
        return st.integers(schema.get("minimum", -(2**40)), schema.get("maximum", 2**40))
    if kinds == "number":
        return st.floats(schema.get("minimum", -1e9), schema.get("maximum", 1e9))
    if kinds == "boolean":
        return st.booleans()
    return st.none()


SCHEMAS = document()["components"]["schemas"]
# mostly the demo catalog's models, so calls get past resolution to the model and back
MODEL_NAMES = st.sampled_from([m.id for m in default_config().models]) | st.text(max_size=12)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)


def dumps(value: Any) -> bytes:
    return json.dumps(value).encode()


def body_strategy(op: dict[str, Any]) -> st.SearchStrategy[bytes | None]:
    request_body = op.get("requestBody")
    if request_body is None:
        return st.one_of(st.none(), JSON_VALUES.map(dumps))
    schema = inline(request_body["content"]["application/json"]["schema"], SCHEMAS)
    valid = from_schema(schema)
    mangled = st.tuples(valid, st.text(max_size=12), JSON_VALUES).map(_mangle)
    return st.one_of(
        valid.map(dumps),
        mangled.map(dumps),
        JSON_VALUES.map(dumps),
        st.binary(max_size=64),
    )


def _mangle(parts: tuple[Any, str, Any]) -> Any:
    """A valid body with one member replaced or added: wrong types, unknown fields."""
    body, name, value = parts
    if not isinstance(body, dict):
        return body
    body = copy.deepcopy(body)
    key = next(iter(body), name) if name == "" else name
    body[key] = value
    return body


def headers_strategy(token: str) -> st.SearchStrategy[dict[str, str]]:
    header_text = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40).map(
        str.strip  # HTTP header values carry no surrounding whitespace
    )
    valid = f"Bearer {token}"
    auth = st.sampled_from([valid, valid, valid, valid, f"{valid}x", "Basic abc", "", None])
    return st.fixed_dictionaries(
        {"Authorization": auth},
        optional={"Idempotency-Key": header_text, "X-Svc-Tags": header_text},
    ).map(lambda h: {k: v for k, v in h.items() if v is not None})


def check_answer(method: str, path: str, response: httpx.Response) -> None:
    where = f"{method.upper()} {path} → {response.status_code}: {response.text[:300]}"
    assert response.status_code < 500, where
    if response.status_code < 400:
        return
    if response.status_code == 429 and response.headers.get("content-type", "").startswith(
        "text/plain"
    ):
        assert path == "/v1/models" and response.text == "rate limit exceeded", where
        return
    body = response.json()
    error = body["error"]
    assert set(error) == {"message", "type", "code", "param"}, where
    assert isinstance(error["message"], str) and error["message"], where
    assert error["param"] is None or isinstance(error["param"], str), where
    assert error["code"] in CATALOG, where
    also = (error["code"], response.status_code) in ALSO_AT.get(path, ())
    assert CATALOG[error["code"]].status == response.status_code or also, where
    assert error["type"] == error_type(response.status_code), where
    assert response.headers["X-Request-Id"].startswith("req_"), where


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("method", "path", "op"), OPERATIONS, ids=[f"{m} {p}" for m, p, _ in OPERATIONS]
)
def test_fuzz_operation(
    fuzz_server: Server, fuzz_token: str, method: str, path: str, op: dict
) -> None:
    server, token = fuzz_server, fuzz_token
    segment = st.text(
        st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="/?#%"),
        min_size=1,
        max_size=30,
    )
    query = st.dictionaries(
        st.sampled_from(["start", "end", "group_by", "limit", "after", "x"]),
        st.text(max_size=12),
        max_size=3,
    )
    methods = st.sampled_from([method, method, method, "get", "post", "put", "patch", "delete"])

    with httpx.Client(base_url=server.url, timeout=30.0) as client:

        @FUZZ
        @given(
            body=body_strategy(op),
            headers=headers_strategy(token),
            params=query,
            verb=methods,
            ident=segment,
        )
        def run(
            body: bytes | None, headers: dict[str, str], params: dict, verb: str, ident: str
        ) -> None:
            target = path.replace("{key_id}", ident).replace("{request_id}", ident)
            if body is not None:
                headers = {**headers, "Content-Type": "application/json"}
            response = client.request(verb, target, content=body, headers=headers, params=params)
            check_answer(verb, target, response)

        run()
    assert server.proc.poll() is None, server.stderr()
    assert server.get("/v1/key", token).status_code == 200
