"""``[cache]``: the response cache (DESIGN.md, "Response cache"; :mod:`gateway.calls.cache`).

Parsed apart from :mod:`gateway.config.settings` (which hooks it in): a table that is
wrong raises :class:`ValueError` with the key it names; settings turns it into its
``ConfigError``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

MODES = ("deterministic", "all")
SCOPES = ("org", "key")


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """Off unless the operator turns it on: a cache changes what a repeated call costs
    and answers, which an operator decides (docs/DECISIONS.md, "Response cache")."""

    enabled: bool = False
    #: deterministic: only calls with temperature 0 or a seed; all: every call
    mode: str = "deterministic"
    ttl_s: float = 3600.0
    max_entries: int = 100_000
    #: org: one organisation's keys share entries; key: each key its own
    scope: str = "org"


_TYPES: dict[str, type | tuple[type, ...]] = {
    "enabled": bool,
    "mode": str,
    "ttl_s": (int, float),
    "max_entries": int,
    "scope": str,
}


def parse_cache(table: object) -> CacheConfig:
    """The ``[cache]`` table, checked (ValueError naming the key that is wrong)."""
    if not isinstance(table, dict):
        raise ValueError("cache: must be a table")
    values: dict[str, Any] = {}
    for key, value in table.items():
        kinds = _TYPES.get(key)
        if kinds is None:
            raise ValueError(f"cache.{key}: unknown key; allowed: {', '.join(_TYPES)}")
        kinds = kinds if isinstance(kinds, tuple) else (kinds,)
        if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
            names = " or ".join(kind.__name__ for kind in kinds)
            raise ValueError(f"cache.{key}: expected {names}, got {type(value).__name__}")
        values[key] = value
    config = replace(CacheConfig(), **values)
    if config.mode not in MODES:
        raise ValueError(f"cache.mode: expected one of {', '.join(MODES)}")
    if config.scope not in SCOPES:
        raise ValueError(f"cache.scope: expected one of {', '.join(SCOPES)}")
    if not math.isfinite(config.ttl_s) or config.ttl_s <= 0:
        raise ValueError("cache.ttl_s: must be a positive number of seconds")
    if config.max_entries < 1:
        raise ValueError("cache.max_entries: must be at least 1")
    return replace(config, ttl_s=float(config.ttl_s))
