"""``[[guardrails]]``: the content rules an organisation or a key may name (DESIGN.md,
"Guardrails"). Parsed and checked at start: an unknown kind, direction, action or entity,
a pattern that does not compile (operator patterns are RE2: linear time, no
backreferences or lookarounds) or a webhook without an http(s) URL is refused with the
key's path, as every other table of the file is."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import re2  # type: ignore[import-untyped]

from gateway.config.checks import ConfigError, check_unknown, http_url, take

KINDS = ("regex", "pii", "secrets", "webhook")
DIRECTIONS = ("input", "output", "both")
ACTIONS = ("deny", "redact", "flag")
ENTITIES = ("email", "phone", "credit_card", "iban", "us_ssn", "ip_address")
ON_ERROR = ("deny", "allow")
#: a webhook's ``stream_chars`` at most (a stream window's own bound)
MAX_STREAM_CHARS = 16_384
#: the keys of a ``[[guardrails]]`` table, each kind's own after the common ones
COMMON_KEYS = ("name", "kind", "on", "action")
KIND_KEYS = {
    "regex": ("patterns",),
    "pii": ("entities",),
    "secrets": (),
    "webhook": ("url", "timeout_s", "on_error", "stream_chars"),
}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")


@dataclass(frozen=True, slots=True)
class GuardrailConfig:
    """One ``[[guardrails]]`` table, checked."""

    name: str
    kind: str
    on: str = "both"
    action: str = "deny"
    #: pii: the entities looked for (all of :data:`ENTITIES` when left out)
    entities: tuple[str, ...] = ENTITIES
    #: regex: the operator's patterns (RE2 syntax)
    patterns: tuple[str, ...] = ()
    #: webhook: where the texts are posted, how long it may take, what its failure means
    url: str | None = None
    timeout_s: float = 2.0
    on_error: str = "deny"
    #: webhook, on a stream's answer: the held text sent once it reaches this many
    #: characters (and at the stream's end), released after the verdict
    stream_chars: int = 200

    def applies(self, direction: str) -> bool:
        """Whether this guardrail checks ``direction`` (``input`` or ``output``)."""
        return self.on in (direction, "both")


def parse_guardrails(tables: object) -> tuple[GuardrailConfig, ...]:
    """The ``[[guardrails]]`` tables of the file (none: an empty tuple)."""
    if not isinstance(tables, list):
        raise ConfigError("guardrails: must be an array of tables ([[guardrails]])")
    parsed = tuple(_parse_one(table, i) for i, table in enumerate(tables))
    names = [g.name for g in parsed]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ConfigError(f"guardrails[{i}].name: duplicate guardrail {name!r}")
    return parsed


def _choice(table: dict[str, Any], key: str, where: str, allowed: tuple[str, ...]) -> str:
    value = take(table, key, where, str)
    if value not in allowed:
        raise ConfigError(f"{where}.{key}: must be one of {', '.join(allowed)}, got {value!r}")
    return str(value)


def _strings(table: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = take(table, key, where, list)
    if not value or not all(isinstance(item, str) and item for item in value):
        raise ConfigError(f"{where}.{key}: must be a non-empty list of strings")
    return tuple(value)


def _parse_one(table: object, index: int) -> GuardrailConfig:
    where = f"guardrails[{index}]"
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: must be a table, got {type(table).__name__}")
    for key in ("name", "kind"):
        if key not in table:
            raise ConfigError(f"{where}.{key}: required")
    kind = _choice(table, "kind", where, KINDS)
    check_unknown(table, COMMON_KEYS + KIND_KEYS[kind], where)
    name = take(table, "name", where, str)
    if not _NAME.match(name):
        raise ConfigError(f"{where}.name: 1-64 letters, digits or _.:- (got {name!r})")
    fields: dict[str, Any] = {"name": name, "kind": kind}
    if "on" in table:
        fields["on"] = _choice(table, "on", where, DIRECTIONS)
    if "action" in table:
        fields["action"] = _choice(table, "action", where, ACTIONS)
    if kind == "pii" and "entities" in table:
        entities = _strings(table, "entities", where)
        for i, entity in enumerate(entities):
            if entity not in ENTITIES:
                raise ConfigError(
                    f"{where}.entities[{i}]: unknown entity {entity!r};"
                    f" known: {', '.join(ENTITIES)}"
                )
        fields["entities"] = entities
    if kind == "regex":
        if "patterns" not in table:
            raise ConfigError(f"{where}.patterns: required for kind regex")
        fields["patterns"] = _strings(table, "patterns", where)
        for i, pattern in enumerate(fields["patterns"]):
            try:
                re2.compile(pattern)
            except re2.error as exc:
                why = exc.args[0].decode() if isinstance(exc.args[0], bytes) else str(exc)
                raise ConfigError(
                    f"{where}.patterns[{i}]: does not compile as RE2 ({why});"
                    " RE2 has no backreferences or lookarounds"
                ) from None
    if kind == "webhook":
        fields.update(_parse_webhook(table, where))
    return GuardrailConfig(**fields)


def _parse_webhook(table: dict[str, Any], where: str) -> dict[str, Any]:
    if "url" not in table:
        raise ConfigError(f"{where}.url: required for kind webhook")
    url = take(table, "url", where, str)
    if not http_url(url):
        raise ConfigError(f"{where}.url: must be an http(s) URL with a host")
    fields: dict[str, Any] = {"url": url}
    if "timeout_s" in table:
        timeout = float(take(table, "timeout_s", where, (int, float)))
        if not 0 < timeout <= 60:
            raise ConfigError(f"{where}.timeout_s: must be above 0 and at most 60")
        fields["timeout_s"] = timeout
    if "on_error" in table:
        fields["on_error"] = _choice(table, "on_error", where, ON_ERROR)
    if "stream_chars" in table:
        chars = take(table, "stream_chars", where, int)
        if not 1 <= chars <= MAX_STREAM_CHARS:
            raise ConfigError(f"{where}.stream_chars: must be from 1 to {MAX_STREAM_CHARS}")
        fields["stream_chars"] = chars
    return fields
