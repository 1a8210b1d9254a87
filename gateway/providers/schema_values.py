"""A JSON value valid against a JSON Schema, drawn deterministically: the mock provider's
structured outputs and tool-call arguments.

Every schema gets a value, however odd: the walk of a schema is bounded in depth (a
``$ref`` to itself ends in the simplest value) and in size (:class:`Draw` carries the
budget), and its numbers are ones JSON can carry (integers within 64 bits, finite
floats), valid whenever the schema allows one. The subset is the one OpenAI's structured
outputs accept. Only ``Draw.random()`` is used, so values are stable across Python
versions.
"""

from __future__ import annotations

import math
import random
import sys
from typing import Any

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


class Draw(random.Random):
    """The answer's random source, carrying how many characters and how many nested values
    the answer may still take (so that no schema makes the mock work for long)."""

    def __init__(self, seed: str) -> None:
        super().__init__(seed)
        self.budget = _MAX_ANSWER_CHARS
        self.values = _MAX_VALUES


def below(rng: random.Random, n: int) -> int:
    return int(rng.random() * n)


def phrase(rng: random.Random, words: int) -> str:
    return " ".join(_WORDS[below(rng, len(_WORDS))] for _ in range(words))


def sample(schema: Any, rng: Draw) -> Any:
    """A value valid against ``schema``, drawn from ``rng``."""
    return _from_schema(schema, rng, schema, 0)


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
        return schema["enum"][below(rng, len(schema["enum"]))]
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
            properties = {**as_dict(merged.get("properties")), **as_dict(part.get("properties"))}
            required = [*_list(merged.get("required")), *_list(part.get("required"))]
            merged.update(part)
            merged.update(properties=properties, required=required)
    return merged


def _object(schema: dict[str, Any], rng: random.Random, root: Any, depth: int) -> dict[str, Any]:
    properties = as_dict(schema.get("properties"))
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
    size = low if depth >= _SOFT_DEPTH else max(low, 1 + below(rng, 2))
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
    if not isinstance(rng, Draw):
        return True
    if rng.budget <= 0 or rng.values <= 0:
        return False
    rng.budget -= chars
    rng.values -= 1
    return True


def as_dict(value: Any) -> dict[str, Any]:
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
    text = phrase(rng, 2)
    wanted = min(_int(schema.get("minLength")), _MAX_STRING, max(0, getattr(rng, "budget", 0)))
    while len(text) < wanted:
        text += " " + phrase(rng, 1)
    if isinstance(rng, Draw):
        rng.budget -= len(text)
    return text[: schema["maxLength"]] if isinstance(schema.get("maxLength"), int) else text
