"""JSON Schema (what OpenAI callers send for tool parameters and json_schema answers) into
Gemini's ``Schema``: the subset of OpenAPI 3.0 the Gemini API takes.

Gemini refuses any member it does not know (400 INVALID_ARGUMENT), so the translation
keeps only :data:`SCHEMA_FIELDS` and rewrites what has a Gemini form:

- ``$ref`` into ``$defs``/``definitions`` is inlined (pydantic's nested models); a
  recursive reference cannot be written in Gemini's subset and is refused;
- ``type: [T, "null"]`` becomes ``type: T, nullable: true``; several types, ``anyOf``;
- ``oneOf`` becomes ``anyOf``; ``allOf`` is merged into one object; ``const`` a
  one-value ``enum``;
- ``enum`` is kept only when every value is a string (Gemini's enums are strings);
- ``format`` only where Gemini has it (``enum``/``date-time`` on strings, ``int32``/
  ``int64``, ``float``/``double``);
- ``additionalProperties``, ``$schema``, ``$id``, ``strict``, ``examples``,
  ``exclusiveMinimum`` and every other member are dropped (constraints the model is not
  held to by Gemini; the caller's own validation still applies);
- an object with no properties keeps no ``properties`` (Gemini refuses an empty one).

Type names are written upper-case, as Google's reference writes them.
"""

from __future__ import annotations

from typing import Any

#: the members of Gemini's ``Schema`` (API reference, v1beta)
SCHEMA_FIELDS = frozenset(
    {
        "type",
        "format",
        "title",
        "description",
        "nullable",
        "enum",
        "maxItems",
        "minItems",
        "properties",
        "required",
        "minProperties",
        "maxProperties",
        "minLength",
        "maxLength",
        "pattern",
        "example",
        "anyOf",
        "propertyOrdering",
        "default",
        "items",
        "minimum",
        "maximum",
    }
)
TYPES = frozenset({"STRING", "NUMBER", "INTEGER", "BOOLEAN", "ARRAY", "OBJECT", "NULL"})
#: the formats Gemini accepts, per type
FORMATS = {
    "STRING": frozenset({"enum", "date-time"}),
    "INTEGER": frozenset({"int32", "int64"}),
    "NUMBER": frozenset({"float", "double"}),
}
#: the members copied as they are (the others are rewritten below)
_COPIED = SCHEMA_FIELDS - {
    "type",
    "format",
    "enum",
    "properties",
    "required",
    "anyOf",
    "propertyOrdering",
    "items",
}


class SchemaRefused(ValueError):
    """A schema that has no form in Gemini's subset (a recursive reference)."""


def gemini_schema(schema: dict[str, Any], *, ordered: bool = False) -> dict[str, Any]:
    """Gemini's form of ``schema``; ``ordered``: give every object its ``propertyOrdering``
    (the order of the caller's properties, which Gemini's JSON answers then follow)."""
    defs: dict[str, Any] = {}
    for name in ("definitions", "$defs"):
        if isinstance(schema.get(name), dict):
            defs.update(schema[name])
    return _convert(schema, defs, (), ordered)


def _convert(
    node: Any, defs: dict[str, Any], seen: tuple[str, ...], ordered: bool
) -> dict[str, Any]:
    if not isinstance(node, dict):
        return {}
    ref = node.get("$ref")
    if isinstance(ref, str):
        name = ref.rsplit("/", 1)[-1]
        if name in seen:
            raise SchemaRefused(
                f"the schema refers to {name!r} recursively, which Gemini's schemas "
                "cannot express; send a schema without recursion"
            )
        target = defs.get(name)
        if not isinstance(target, dict):
            raise SchemaRefused(f"the schema's $ref {ref!r} names no definition")
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _convert(merged, defs, (*seen, name), ordered)
    node = _merge_all_of(node, defs)
    out: dict[str, Any] = {key: node[key] for key in _COPIED if key in node}
    alternatives = node.get("anyOf", node.get("oneOf"))
    if isinstance(alternatives, list):
        options = [alt for alt in alternatives if not _is_null(alt)]
        if len(options) < len(alternatives):
            out["nullable"] = True
        converted = [_convert(alt, defs, seen, ordered) for alt in options]
        if len(converted) == 1:
            out.update(converted[0])
        elif converted:
            out["anyOf"] = converted
    _type(node, out)
    if "const" in node and isinstance(node["const"], str):
        out["enum"] = [node["const"]]
        out.setdefault("type", "STRING")
    enum = node.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(value, str) for value in enum):
        out["enum"] = enum
        out.setdefault("type", "STRING")
    fmt = node.get("format")
    if isinstance(fmt, str) and fmt in FORMATS.get(out.get("type", ""), ()):
        out["format"] = fmt
    properties = node.get("properties")
    if isinstance(properties, dict) and properties:
        out["properties"] = {
            name: _convert(value, defs, seen, ordered) for name, value in properties.items()
        }
        out.setdefault("type", "OBJECT")
        required = node.get("required")
        if isinstance(required, list):
            kept = [name for name in required if name in properties]
            if kept:
                out["required"] = kept
        if ordered:
            out["propertyOrdering"] = list(properties)
    items = node.get("items")
    if isinstance(items, dict):
        out["items"] = _convert(items, defs, seen, ordered)
    elif isinstance(items, list) and items:  # a tuple: Gemini has arrays of one item type
        out["items"] = _convert(items[0], defs, seen, ordered)
    if out.get("type") == "ARRAY" and "items" not in out:
        out["items"] = {"type": "STRING"}  # Gemini refuses an array without items
    return out


def _type(node: dict[str, Any], out: dict[str, Any]) -> None:
    declared = node.get("type")
    names = declared if isinstance(declared, list) else [declared]
    types = [str(name).upper() for name in names if isinstance(name, str)]
    if "NULL" in types and len(types) > 1:
        out["nullable"] = True
        types.remove("NULL")
    types = [name for name in types if name in TYPES]
    if len(types) == 1:
        out["type"] = types[0]
    elif len(types) > 1:
        out["anyOf"] = [{"type": name} for name in types]


def _is_null(node: Any) -> bool:
    return isinstance(node, dict) and node.get("type") == "null" and len(node) == 1


def _merge_all_of(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """``allOf`` of objects as one object: properties and required lists joined (a part
    that is a ``$ref`` read from ``defs``)."""
    parts = node.get("allOf")
    if not isinstance(parts, list):
        return node
    merged = {key: value for key, value in node.items() if key != "allOf"}
    for part in parts:
        if isinstance(part, dict) and isinstance(part.get("$ref"), str):
            part = defs.get(part["$ref"].rsplit("/", 1)[-1])
        if not isinstance(part, dict):
            continue
        for key, value in part.items():
            if key == "properties" and isinstance(value, dict):
                merged["properties"] = {**merged.get("properties", {}), **value}
            elif key == "required" and isinstance(value, list):
                merged["required"] = [*merged.get("required", []), *value]
            else:
                merged.setdefault(key, value)
    return merged
