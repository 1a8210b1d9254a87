"""What ``/openapi.json`` says of this server and of the key that fetched it.

:func:`gateway.edge.openapi.document` describes what the parsers accept. A running server
knows more, and a request the served document allows must not be refused for it (a
fuzzer given the document alone, schemathesis, checks exactly that):

- its catalog: ``/v1/embeddings`` accepts only the served embedding model (an enum) and
  at most its ``dimensions``; the chat endpoints refuse with 400 the names of embedding
  models, and with 503 those of disabled models (``not`` those names). Other names are a
  state of the catalog (404 model_not_found), as is a model's capability (400
  model_lacks_*: the document does not tie capabilities to names);
- its ``[[guardrails]]``: the names a sub-key may add;
- fetched with a key (``Authorization: Bearer``): that key's output budget (the maximum
  of every ``max_tokens``), and what a sub-key of it may be (``POST /v1/keys``: the
  parent's mode, environment and BYOK; its scopes, caps, data mode, models, tools and
  pinned tags as bounds). Without a key, or with a key that is not valid, the document
  is the server's alone: it never refuses.

The facts are frozen values, so that a document is built once per server state and key
settings (:func:`served_document` is cached).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from gateway.accounts.catalog import Catalog
from gateway.accounts.key_fields import MAX_COUNT, MAX_USD, MODEL_LIST, MODEL_LIST_ALIAS, USD_CAPS
from gateway.accounts.key_record import CAP_FIELDS, DATA_MODES, KeyRecord
from gateway.accounts.subkey_rules import SUB_KEY_SCOPES
from gateway.accounts.tool_rules import SEPARATOR
from gateway.edge.openapi import document

#: the request schemas holding an output budget, and its fields
BUDGETS = {
    "ChatCompletionRequest": ("max_tokens", "max_completion_tokens"),
    "ResponsesRequest": ("max_output_tokens",),
    "MessagesRequest": ("max_tokens",),
    "CountTokensRequest": ("max_tokens",),
}
#: the request schemas whose model is a chat model
CHAT_BODIES = ("ChatCompletionRequest", "ResponsesRequest", "MessagesRequest", "CountTokensRequest")


@dataclass(frozen=True)
class ServerFacts:
    """What every client of this server may rely on."""

    chat_example: str | None
    #: the served embedding model and its dimensions
    embedding: tuple[str, int] | None
    #: names (ids, aliases) a chat endpoint refuses: other kinds, disabled models
    not_chat: tuple[str, ...]
    guardrails: tuple[str, ...]


@dataclass(frozen=True)
class KeyFacts:
    """What the key that fetched the document may send."""

    max_output_tokens: int
    mode: str
    environment: str
    byok: bool
    scopes: tuple[str, ...]
    #: (cap, the key's limit); None: unlimited
    caps: tuple[tuple[str, float | None], ...]
    data_mode: str
    #: the models a sub-key may name: the organisation's API catalog within the key's list
    models: tuple[str, ...]
    tools: tuple[str, ...] | None
    #: required tags whose value the key pins
    pinned_tags: tuple[tuple[str, str], ...]


def server_facts(catalog: Catalog, guardrails: Iterable[str]) -> ServerFacts:
    served = list(catalog.models.values())
    chat = next((m.id for m in served if m.kind == "chat"), None)
    embedding = catalog.embedding_model()
    kinds = {m.id: m.kind for m in catalog.every()}
    names = {*kinds, *(alias for m in catalog.every() for alias in m.config.aliases)}
    refused = []
    for name in sorted(names):
        meant = catalog.candidates(name)
        if len(meant) == 1 and (catalog.is_disabled(meant[0]) or kinds[meant[0]] != "chat"):
            refused.append(name)
    return ServerFacts(
        chat_example=chat,
        embedding=None if embedding is None else (embedding.id, embedding.config.dimensions),
        not_chat=tuple(refused),
        guardrails=tuple(guardrails),
    )


def key_facts(caller: KeyRecord, manager: KeyRecord, catalog: Iterable[str]) -> KeyFacts:
    """``caller`` fetched the document; ``manager`` is the key its sub-keys belong to
    (itself, or its successor if it was rotated); ``catalog`` the ids of the models of
    the organisation's API catalog."""
    listed = manager.allowed_models
    return KeyFacts(
        max_output_tokens=caller.caps.max_output_tokens,
        mode=manager.mode,
        environment=manager.environment,
        byok=manager.byok,
        scopes=tuple(s for s in SUB_KEY_SCOPES if s in manager.scopes),
        caps=tuple((cap, getattr(manager.caps, cap)) for cap in CAP_FIELDS),
        data_mode=manager.data_mode,
        models=tuple(m for m in catalog if listed is None or m in listed),
        tools=manager.allowed_tools,
        pinned_tags=tuple(sorted((k, v) for k, v in manager.required_tags.items() if v)),
    )


@lru_cache(maxsize=256)
def served_document(server: ServerFacts, key: KeyFacts | None = None) -> dict[str, Any]:
    """The document of this server, as ``key`` may use it (None: any key)."""
    base = document(server.chat_example, server.embedding[0] if server.embedding else None)
    schemas = base["components"]["schemas"]
    changes: dict[str, dict[str, Any]] = defaultdict(dict)

    def field(name: str, prop: str) -> dict[str, Any]:
        return dict(changes[name].get(prop) or schemas[name]["properties"][prop])

    if server.not_chat:
        for name in CHAT_BODIES:
            changes[name]["model"] = {
                **field(name, "model"),
                "not": {"enum": list(server.not_chat)},
            }
    if server.embedding is not None:
        model, dimensions = server.embedding
        changes["EmbeddingsRequest"]["model"] = {"enum": [model]}
        dims = field("EmbeddingsRequest", "dimensions")
        changes["EmbeddingsRequest"]["dimensions"] = {**dims, "maximum": dimensions}
    guardrails = field("SubKeyCreate", "guardrails")
    changes["SubKeyCreate"]["guardrails"] = _names_of(guardrails, server.guardrails)
    if key is not None:
        for name, budgets in BUDGETS.items():
            for budget in budgets:
                changes[name][budget] = {**field(name, budget), "maximum": key.max_output_tokens}
        changes["SubKeyCreate"].update(_sub_key_of(schemas["SubKeyCreate"]["properties"], key))
    edited = {
        name: {**schemas[name], "properties": {**schemas[name]["properties"], **props}}
        for name, props in changes.items()
    }
    return {**base, "components": {**base["components"], "schemas": {**schemas, **edited}}}


def _names_of(field: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """A nullable list of strings whose items are ``names`` (none: only null or [])."""
    if not names:
        return {**field, "maxItems": 0}
    return {**field, "items": {**field["items"], "enum": list(names)}}


def _tools_within(field: dict[str, Any], parent: tuple[str, ...]) -> dict[str, Any]:
    """Tool patterns within the parent's (gateway/accounts/tool_rules.py, ``covered``):
    one of its patterns, or a name or pattern under one of its ``server__*`` that is no
    wildcard itself."""
    wildcard = f"{SEPARATOR}*"
    under = [
        {"pattern": f"^{p[:-1]}", "not": {"pattern": r"__\*$"}}
        for p in parent
        if p.endswith(wildcard)
    ]
    within = [{"enum": list(parent)}, *under] if parent else [{"not": {}}]
    return {**field, "items": {**field["items"], "anyOf": within}}


def _sub_key_of(fields: dict[str, Any], key: KeyFacts) -> dict[str, Any]:
    """The fields of POST /v1/keys that ``key`` bounds, as it may send them
    (gateway/accounts/subkey_rules.py)."""
    props = {
        "mode": {**fields["mode"], "enum": [key.mode]},
        "environment": {**fields["environment"], "enum": [key.environment]},
        "byok": {**fields["byok"], "const": key.byok},
        "scopes": _names_of(fields["scopes"], key.scopes),
        "data_mode": {"enum": list(DATA_MODES[DATA_MODES.index(key.data_mode) :])},
        **{name: _names_of(fields[name], key.models) for name in (MODEL_LIST, MODEL_LIST_ALIAS)},
    }
    if key.tools is not None:
        props["allowed_tools"] = _tools_within(fields["allowed_tools"], key.tools)
    caps = dict(fields["caps"]["properties"])
    for cap, limit in key.caps:
        if limit is not None:  # a limited parent: the child is limited too, at most as much
            kind = "number" if cap in USD_CAPS else "integer"
            highest = MAX_USD if cap in USD_CAPS else MAX_COUNT
            caps[cap] = {**caps[cap], "type": kind, "maximum": min(limit, highest)}
    props["caps"] = {**fields["caps"], "properties": caps}
    if key.pinned_tags:
        value = fields["required_tags"]["additionalProperties"]
        pinned = {k: {**value, "enum": ["", v]} for k, v in key.pinned_tags}
        props["required_tags"] = {**fields["required_tags"], "properties": pinned}
    return props
