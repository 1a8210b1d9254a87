"""The checks every table of the config file shares, and :class:`ConfigError`: a problem
whose message names the key at fault by its path (``models[2].provider``)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any


class ConfigError(Exception):
    """A configuration problem; the message names the key at fault."""


def take(table: dict[str, Any], key: str, where: str, kind: type | tuple[type, ...]) -> Any:
    value = table[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        raise ConfigError(f"{where}.{key}: expected {_names(kinds)}, got a boolean")
    if not isinstance(value, kinds):
        raise ConfigError(f"{where}.{key}: expected {_names(kinds)}, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}.{key}: must be a finite number")
    return value


def _names(kinds: tuple[type, ...]) -> str:
    return " or ".join(k.__name__ for k in kinds)


def require_table(table: object, where: str) -> None:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: must be a table, got {type(table).__name__}")


def check_unknown(table: dict[str, Any], allowed: Iterable[str], where: str) -> None:
    """Refuse a key the table does not take, naming every key it does take (in the order
    of docs/CONFIG.md), so that one try shows what the table holds."""
    require_table(table, where)
    names = tuple(allowed)
    for key in table:
        if key not in names:
            raise ConfigError(f"{where}.{key}: unknown key; allowed: {', '.join(names)}")


def http_url(url: str) -> bool:
    match = re.fullmatch(r"https?://([^/?#\s]+)(?:[/?#]\S*)?", url)
    return match is not None and match.group(1).rsplit("@", 1)[-1].split(":")[0] != ""
