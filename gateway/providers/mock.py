"""The deterministic mock provider that serves every sandbox key.

The content derives from a SHA-256 digest of the canonical JSON (sorted keys) of the
upstream model and the parameters that shape an answer (:data:`_ANSWER_KEYS`), so the same
body gives the same answer, streamed or not: same text, same tool call, same usage.
``max_tokens`` and ``stop`` are left out of the digest: they only cut the same answer
shorter. Ids and timestamps are per call, as a real provider's are (tracing and dedupe
tools key on them): ``chatcmpl-<hex>`` and the tool call's ``call_<hex>`` carry the hex of
the gateway's request id (a fresh random one without it), ``created`` is the clock's
second.

The answer, in order of precedence:

1. a tool call to the first function tool, when ``tools`` is non-empty, ``tool_choice`` is
   not ``"none"`` and the last message is not a tool result (so an agent loop ends), with
   JSON arguments that satisfy the tool's ``parameters`` schema;
2. a JSON value satisfying ``response_format.json_schema.schema``, or a JSON object for
   ``json_object``;
3. prose, mentioning how many images the messages hold.

Every schema gets an answer, however odd: the walk of a schema is bounded in depth (a
``$ref`` to itself ends in the simplest value) and in size, and its numbers are ones JSON
can carry (integers within 64 bits, finite floats), valid whenever the schema allows one.

Tokens are the mock's own: a word or a punctuation mark with its leading whitespace
(:func:`count_tokens`). Each covers at least one character, so every count here stays
below the byte-based bound of :mod:`gateway.estimate`. The output is cut at ``max_tokens``
of them (finish_reason ``length``); a stream sends one of them per chunk.

Embeddings are unit vectors from SHAKE-256 of each input, independent of the dimensions:
a shorter vector is the renormalised prefix of a longer one, as with OpenAI's
``text-embedding-3`` models. Values are rounded to float32, so the ``float`` and
``base64`` encodings carry the same numbers.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
import secrets
import struct
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import trio

from gateway.config import ModelConfig
from gateway.estimate import IMAGE_PART_TYPES
from gateway.providers.base import EmbeddingResult, ProviderRequest, ProviderResult, Usage

DEFAULT_DIMENSIONS = 1536
SYSTEM_FINGERPRINT = "fp_mock"
MESSAGE_TOKENS = 3
IMAGE_TOKENS = 85  # OpenAI's price of a "low" detail image

_ANSWER_KEYS = (
    "messages",
    "tools",
    "tool_choice",
    "response_format",
    "temperature",
    "top_p",
    "seed",
)
# Parameters the mock honours, or that change no answer of any provider.
_READ_KEYS = frozenset(
    {*_ANSWER_KEYS, "model", "max_tokens", "max_completion_tokens", "stop", "stream"}
    | {"stream_options", "user", "metadata", "service_tier", "parallel_tool_calls"}
)
_TOKEN = re.compile(r"\s*\w+|\s*[^\w\s]|\s+")
_WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india")
_FORMATS = {
    "date-time": "2026-01-01T00:00:00Z",
    "date": "2026-01-01",
    "time": "00:00:00Z",
    "email": "mock@example.com",
    "uri": "https://example.com/mock",
    "uuid": "00000000-0000-4000-8000-000000000000",
}
# Depth of the schema walk (each $ref, combinator branch, member or item is one step): past
# the soft bound only what the schema requires is generated, and at the hard bound the
# simplest value, so every schema ends, well inside orjson's 255 levels of nesting
_SOFT_DEPTH = 12
_MAX_DEPTH = 48
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1  # the integers orjson writes
_FLOAT_MAX = sys.float_info.max
# a schema's minItems / minLength are honoured up to these bounds, so that no request can
# make the mock build an answer big enough to stall the server
_MAX_ITEMS = 10_000
_MAX_STRING = 100_000
_MAX_ANSWER_CHARS = 1_000_000  # past this, arrays stop growing and strings stay short
_MAX_VALUES = 100_000  # past this many members and items, objects and arrays stop growing


class _Draw(random.Random):
    """The answer's random source, carrying how many characters and how many nested values
    the answer may still take (so that no schema makes the mock work for long)."""

    def __init__(self, seed: str) -> None:
        super().__init__(seed)
        self.budget = _MAX_ANSWER_CHARS
        self.values = _MAX_VALUES


def count_tokens(text: str) -> int:
    """The mock's token count of ``text``: words and punctuation marks."""
    return len(_TOKEN.findall(text))


def prompt_tokens(body: dict[str, Any]) -> int:
    """The mock's prompt tokens of a chat body (never above the gateway's estimate)."""
    messages = body.get("messages") or []
    total = MESSAGE_TOKENS * (len(messages) + 1) + sum(
        IMAGE_TOKENS if leaf is None else count_tokens(leaf) for leaf in _leaves(messages)
    )
    for key in ("tools", "response_format"):
        if body.get(key):
            total += count_tokens(orjson.dumps(body[key]).decode())
    return total


@dataclass(frozen=True, slots=True)
class _Answer:
    id: str
    created: int
    model: str
    pieces: list[str]  # content, or the tool call's arguments
    finish_reason: str
    usage: Usage
    tool_call: tuple[str, str] | None  # (call id, function name)


class MockProvider:
    """The deterministic provider of sandbox keys.

    ``chunk_delay`` slows each stream chunk, and a whole answer by as long as its stream
    would take (one delay per chunk), so a slow model is slow streamed or not. ``clock``
    (epoch seconds) dates the answers.
    """

    def __init__(
        self,
        *,
        embedding_dimensions: Mapping[str, int] | None = None,
        chunk_delay: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._dimensions = dict(embedding_dimensions or {})
        self._chunk_delay = chunk_delay
        self._clock = clock

    @classmethod
    def for_models(
        cls,
        models: Iterable[ModelConfig],
        chunk_delay: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> MockProvider:
        """A mock that knows the configured dimensions of the embedding models."""
        dimensions = {m.upstream_id: m.dimensions for m in models if m.kind == "embedding"}
        return cls(embedding_dimensions=dimensions, chunk_delay=chunk_delay, clock=clock)

    async def complete(self, request: ProviderRequest) -> ProviderResult:
        answer = _answer(request, int(self._clock()))
        # the chunks of the stream of the same answer: role, one per piece, finish, usage
        await self._pause(len(answer.pieces) + 3)
        message: dict[str, Any] = {"role": "assistant", "content": "".join(answer.pieces)}
        if answer.tool_call:
            call_id, name = answer.tool_call
            function = {"name": name, "arguments": message["content"]}
            message["content"] = None
            message["tool_calls"] = [{"id": call_id, "type": "function", "function": function}]
        choice = {"index": 0, "message": message, "finish_reason": answer.finish_reason}
        completion = {
            **_header(answer, "chat.completion"),
            "choices": [{**choice, "logprobs": None}],
            "usage": answer.usage.as_dict(),
        }
        return ProviderResult(completion=completion, usage=answer.usage)

    async def stream(self, request: ProviderRequest) -> AsyncIterator[dict[str, Any]]:
        answer = _answer(request, int(self._clock()))
        header = _header(answer, "chat.completion.chunk")
        first: dict[str, Any] = {"role": "assistant", "content": ""}
        if answer.tool_call:
            call_id, name = answer.tool_call
            function = {"name": name, "arguments": ""}
            call = {"index": 0, "id": call_id, "type": "function", "function": function}
            first = {"role": "assistant", "content": None, "tool_calls": [call]}
        deltas = [first]
        for piece in answer.pieces:
            if answer.tool_call:
                deltas.append({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
            else:
                deltas.append({"content": piece})
        for index, delta in enumerate([*deltas, {}]):
            await self._pause()
            reason = answer.finish_reason if index == len(deltas) else None
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
            yield {**header, "choices": [choice]}
        await self._pause()
        yield {**header, "choices": [], "usage": answer.usage.as_dict()}

    async def embed(
        self,
        upstream_model: str,
        inputs: list[Any],
        dimensions: int | None,
        api_key: str | None,
    ) -> EmbeddingResult:
        await trio.lowlevel.checkpoint()
        size = dimensions or self._dimensions.get(upstream_model, DEFAULT_DIMENSIONS)
        vectors = [_unit_vector(upstream_model, item, size) for item in inputs]
        tokens = sum(count_tokens(item) if isinstance(item, str) else len(item) for item in inputs)
        return EmbeddingResult(vectors=vectors, usage=Usage(prompt_tokens=tokens))

    def ignored_parameters(self, body: dict[str, Any]) -> list[str]:
        return [key for key in body if key not in _READ_KEYS]

    async def _pause(self, chunks: int = 1) -> None:
        if self._chunk_delay > 0:
            await trio.sleep(self._chunk_delay * chunks)
        else:
            await trio.lowlevel.checkpoint()


# ---------------------------------------------------------------- answers


def _answer(request: ProviderRequest, created: int) -> _Answer:
    body = request.body
    call = request.request_id.removeprefix("req_") or secrets.token_hex(12)
    shaping = {key: body[key] for key in _ANSWER_KEYS if key in body}
    canonical = orjson.dumps([request.upstream_model, shaping], option=orjson.OPT_SORT_KEYS)
    digest = hashlib.sha256(canonical).hexdigest()
    rng = _Draw(digest)  # only .random() is used: stable across Python versions
    messages = body.get("messages") or []
    tool = _tool_to_call(body, messages)
    if tool is not None:
        schema = tool.get("parameters")
        schema = schema if isinstance(schema, dict) and schema else {"type": "object"}
        text = _json(_from_schema(schema, rng, schema, 0))
        tool_call: tuple[str, str] | None = (f"call_{call}", tool["name"])
        reason = "tool_calls"
    else:
        text, tool_call, reason = _content(body, messages, rng), None, "stop"
        text = _cut_at_stop(text, body.get("stop"))
    pieces = _TOKEN.findall(text)
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    if isinstance(limit, int) and len(pieces) > limit:
        pieces, reason = pieces[:limit], "length"
    usage = Usage(prompt_tokens=prompt_tokens(body), completion_tokens=len(pieces))
    answer_id = f"chatcmpl-{call}"
    return _Answer(answer_id, created, request.upstream_model, pieces, reason, usage, tool_call)


def _header(answer: _Answer, obj: str) -> dict[str, Any]:
    return {
        "id": answer.id,
        "object": obj,
        "created": answer.created,
        "model": answer.model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }


def _tool_to_call(body: dict[str, Any], messages: list[Any]) -> dict[str, Any] | None:
    if body.get("tool_choice") == "none" or not isinstance(body.get("tools"), list):
        return None
    if messages and isinstance(messages[-1], dict) and messages[-1].get("role") == "tool":
        return None
    for tool in body["tools"]:
        if isinstance(tool, dict) and tool.get("type") == "function":
            function = tool.get("function")
            if isinstance(function, dict) and isinstance(function.get("name"), str):
                return function
    return None


def _content(body: dict[str, Any], messages: list[Any], rng: random.Random) -> str:
    response_format = body.get("response_format")
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "json_schema":  # the parser checked the shape; an odd one is an object
        schema = _dict(response_format.get("json_schema")).get("schema")
        schema = schema if isinstance(schema, dict) and schema else {"type": "object"}
        return _json(_from_schema(schema, rng, schema, 0))
    if kind == "json_object":
        return orjson.dumps({"answer": _phrase(rng, 6)}).decode()
    images = sum(leaf is None for leaf in _leaves(messages))
    seen = f"; I see {images} image{'' if images == 1 else 's'}" if images else ""
    return f"This is a deterministic mock reply{seen}. {_phrase(rng, 8 + _below(rng, 24))}."


def _json(value: Any) -> str:
    """``value`` as JSON text. The generator writes only serialisable numbers and nests
    less than orjson's limit, but a caller's ``const`` or ``enum`` value placed deep in the
    answer could pass it: then the answer is an empty object rather than a crash."""
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        return "{}"


def _cut_at_stop(text: str, stop: Any) -> str:
    sequences = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    cuts = [text.find(s) for s in sequences if isinstance(s, str) and s and s in text]
    return text[: min(cuts)] if cuts else text


def _leaves(value: Any) -> Iterator[str | None]:
    """The strings inside ``value``, and ``None`` for each image part."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict) and value.get("type") in IMAGE_PART_TYPES:
        yield None
    elif isinstance(value, dict | list):
        for item in value.values() if isinstance(value, dict) else value:
            yield from _leaves(item)


def _below(rng: random.Random, n: int) -> int:
    return int(rng.random() * n)


def _phrase(rng: random.Random, words: int) -> str:
    return " ".join(_WORDS[_below(rng, len(_WORDS))] for _ in range(words))


def _unit_vector(model: str, item: Any, size: int) -> list[float]:
    raw = hashlib.shake_256(orjson.dumps([model, item])).digest(4 * size)
    ints = struct.unpack(f"<{size}i", raw)
    norm = math.sqrt(math.fsum(float(v) * v for v in ints)) or 1.0
    return list(struct.unpack(f"<{size}f", struct.pack(f"<{size}f", *(v / norm for v in ints))))


# ---------------------------------------------------------------- JSON schema values


def _from_schema(schema: Any, rng: random.Random, root: Any, depth: int) -> Any:
    """A value valid against ``schema``: the subset OpenAI's structured outputs accept.

    ``depth`` counts the steps taken from the root (a ``$ref``, a combinator's branch, an
    object member, an array item), so recursion through any of them ends: past
    :data:`_SOFT_DEPTH` only what the schema requires is generated, and at
    :data:`_MAX_DEPTH` the simplest value of the schema's type (:func:`_simplest`).

    Not supported: ``pattern``, ``uniqueItems``, ``not``, conditional keywords.
    """
    if depth >= _MAX_DEPTH:
        return _simplest(schema, rng)
    if not isinstance(schema, dict):
        return "mock"  # ``true`` (or a malformed schema): anything goes
    if isinstance(schema.get("$ref"), str):
        return _from_schema(_resolve(schema["$ref"], root), rng, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][_below(rng, len(schema["enum"]))]
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            branches = schema[key]
            if depth >= _SOFT_DEPTH:  # prefer a branch that ends the recursion
                branches = [b for b in branches if not _is_ref(b)] or branches
            return _from_schema(branches[0], rng, root, depth + 1)
    if isinstance(schema.get("allOf"), list):
        return _from_schema(_merge(schema, root), rng, root, depth + 1)
    kind = _kind(schema)
    if kind == "object":
        return _object(schema, rng, root, depth)
    if kind == "array":
        return _array(schema, rng, root, depth)
    if kind in ("integer", "number"):
        return _number(schema, rng, integer=kind == "integer")
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    return _string(schema, rng)


def _kind(schema: dict[str, Any]) -> Any:
    """The type to generate: the first non-null one named, else one implied by keywords."""
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "array" if "items" in schema or "prefixItems" in schema else None
        kind = "object" if "properties" in schema or "required" in schema else kind
    return kind


def _simplest(schema: Any, rng: random.Random) -> Any:
    """The value at the depth bound, built without descending: valid for a schema that
    needs no nesting (a recursive schema that requires its own recursion has no finite
    valid value at all, and gets an empty object, an empty array or null)."""
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    kind = _kind(schema)
    if kind in ("integer", "number"):
        return _number(schema, rng, integer=kind == "integer")
    if kind == "string":
        return _string(schema, rng)
    return {"object": {}, "array": [], "boolean": False}.get(kind)


def _is_ref(schema: Any) -> bool:
    return isinstance(schema, dict) and "$ref" in schema


def _resolve(ref: str, root: Any) -> Any:
    node = root
    for part in ref.removeprefix("#").strip("/").split("/"):
        if not part:
            continue
        part = part.replace("~1", "/").replace("~0", "~")
        node = node.get(part) if isinstance(node, dict) else None
    return node if node is not None else {}


def _merge(schema: dict[str, Any], root: Any) -> dict[str, Any]:
    """``schema`` with its ``allOf`` parts merged in (a part's own ``allOf`` is kept, and
    merged one depth further)."""
    merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
    for part in schema["allOf"]:
        for _ in range(_MAX_DEPTH):  # a $ref may point at itself, or round a loop
            if not (isinstance(part, dict) and isinstance(part.get("$ref"), str)):
                break
            part = _resolve(part["$ref"], root)
        else:
            continue  # still a $ref: a loop, with nothing to merge
        if isinstance(part, dict):
            properties = {**_dict(merged.get("properties")), **_dict(part.get("properties"))}
            required = [*_list(merged.get("required")), *_list(part.get("required"))]
            merged.update(part)
            merged.update(properties=properties, required=required)
    return merged


def _object(schema: dict[str, Any], rng: random.Random, root: Any, depth: int) -> dict[str, Any]:
    properties = _dict(schema.get("properties"))
    required = [name for name in _list(schema.get("required")) if isinstance(name, str)]
    names = required if depth >= _SOFT_DEPTH else [*properties, *required]
    value: dict[str, Any] = {}
    for name in dict.fromkeys(names):
        if not _spend(rng, len(name) + 4):  # a member costs at least "name": and a comma
            break
        value[name] = _from_schema(properties.get(name, True), rng, root, depth + 1)
    return value


def _array(schema: dict[str, Any], rng: random.Random, root: Any, depth: int) -> list[Any]:
    low = min(_int(schema.get("minItems")), _MAX_ITEMS)
    size = low if depth >= _SOFT_DEPTH else max(low, 1 + _below(rng, 2))
    if isinstance(schema.get("maxItems"), int):
        size = min(size, schema["maxItems"])
    prefix = _list(schema.get("prefixItems"))
    items = schema.get("items", True)
    values = []
    for i in range(max(size, len(prefix))):
        if not _spend(rng, 1):  # an element costs at least its separator
            break
        values.append(_from_schema(prefix[i] if i < len(prefix) else items, rng, root, depth + 1))
    return values


def _spend(rng: random.Random, chars: int) -> bool:
    """Take a value and ``chars`` from the answer's budget; false once either is spent."""
    if not isinstance(rng, _Draw):
        return True
    if rng.budget <= 0 or rng.values <= 0:
        return False
    rng.budget -= chars
    rng.values -= 1
    return True


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _int(value: Any) -> int:
    """A schema bound as a non-negative int (0 when absent or malformed)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _number(schema: dict[str, Any], rng: random.Random, integer: bool) -> int | float:
    """A number inside the schema's bounds, on its ``multipleOf``, always serialisable:
    an integer within 64 bits, a float finite (bounds outside them are clamped, so a
    schema no such number satisfies gets one anyway)."""

    def bound(key: str) -> float | None:
        value = schema.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        if isinstance(value, float) and not math.isfinite(value):
            return None
        return max(-_FLOAT_MAX, min(value, _FLOAT_MAX))  # an int this size overflows a float

    lows = [b for b in (bound("minimum"), bound("exclusiveMinimum")) if b is not None]
    highs = [b for b in (bound("maximum"), bound("exclusiveMaximum")) if b is not None]
    low = max(lows) if lows else (min(highs) - 100 if highs else 0)
    high = min(highs) if highs else low + 100
    if integer:  # held within 64 bits, not rounded: 5.5 stays a bound above 5
        low, high = (max(_INT64_MIN, min(b, _INT64_MAX)) for b in (low, high))
    share = 0.25 + rng.random() / 2
    value: int | float = (1 - share) * low + share * high  # strictly inside when low < high
    step = bound("multipleOf") or (1 if integer else None)
    if step is not None and math.isfinite(value / step):
        stepped = math.ceil(value / step) * step
        if stepped > high or stepped == bound("exclusiveMaximum"):
            stepped -= step
        if math.isfinite(stepped):
            value = stepped
    if integer and float(value).is_integer():
        return _int64(int(value))
    if isinstance(value, int) and value != _int64(value):
        return float(value)
    return value


def _int64(value: float) -> int:
    """``value`` as an int held within 64 bits (what orjson can write)."""
    return max(_INT64_MIN, min(int(value), _INT64_MAX))


def _string(schema: dict[str, Any], rng: random.Random) -> str:
    if schema.get("format") in _FORMATS:
        return _FORMATS[schema["format"]]
    text = _phrase(rng, 2)
    wanted = min(_int(schema.get("minLength")), _MAX_STRING, max(0, getattr(rng, "budget", 0)))
    while len(text) < wanted:
        text += " " + _phrase(rng, 1)
    if isinstance(rng, _Draw):
        rng.budget -= len(text)
    return text[: schema["maxLength"]] if isinstance(schema.get("maxLength"), int) else text
