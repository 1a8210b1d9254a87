"""The ``[[mcp_servers]]`` tables: the operator's MCP servers the gateway fronts at ``/mcp``.

Each table names one upstream, reached over Streamable HTTP (``url``) or started as a
stdio child (``command``), its credentials from the environment (``headers_env``: header
name → variable), and its price per ``tools/call`` (``usd_per_call``, per tool in
``tool_usd_per_call``). :func:`parse_mcp_servers` raises :class:`McpConfigError` naming the
offending key; :mod:`gateway.config.settings` turns it into its ``ConfigError`` (this module
imports nothing of it, so the import runs one way).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

#: the keys of a ``[[mcp_servers]]`` table, in the order of docs/CONFIG.md
MCP_SERVER_KEYS = (
    "name",
    "url",
    "command",
    "headers_env",
    "usd_per_call",
    "tool_usd_per_call",
    "zero_retention_available",
    "timeout_s",
)
#: the built-in deterministic server of sandbox keys
MOCK_SERVER = "mock"
#: a server name: it prefixes its tools' names (``name__tool``), so no double underscore
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]*(?:_[A-Za-z0-9-]+)*")


class McpConfigError(ValueError):
    """A ``[[mcp_servers]]`` table the loader refuses; the message names the key."""


@dataclass(frozen=True, slots=True)
class McpServerConfig:
    name: str
    #: a Streamable HTTP endpoint; or ``command``, a stdio child the gateway supervises
    url: str | None = None
    command: tuple[str, ...] = ()
    #: header name → environment variable holding its value (the caller's key never goes)
    headers_env: dict[str, str] = field(default_factory=dict)
    usd_per_call: float = 0.0
    tool_usd_per_call: dict[str, float] = field(default_factory=dict)
    zero_retention_available: bool = False
    timeout_s: float = 60.0

    def price_usd(self, tool: str) -> float:
        """The price of one call of ``tool``: its own, else the server's."""
        return self.tool_usd_per_call.get(tool, self.usd_per_call)


def _value(table: dict[str, Any], key: str, where: str, kinds: tuple[type, ...]) -> Any:
    value = table[key]
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise McpConfigError(f"{where}.{key}: expected {names}, got {type(value).__name__}")
    return value


def _price(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise McpConfigError(f"{where}: expected a number of USD")
    if not math.isfinite(value) or value < 0:
        raise McpConfigError(f"{where}: must be a finite non-negative number of USD")
    return float(value)


def _parse_one(table: Any, index: int) -> McpServerConfig:
    where = f"mcp_servers[{index}]"
    if not isinstance(table, dict):
        raise McpConfigError(f"{where}: must be a table")
    for key in table:
        if key not in MCP_SERVER_KEYS:
            raise McpConfigError(
                f"{where}.{key}: unknown key; allowed: {', '.join(MCP_SERVER_KEYS)}"
            )
    if "name" not in table:
        raise McpConfigError(f"{where}.name: required")
    name = _value(table, "name", where, (str,))
    if not _NAME.fullmatch(name) or name == MOCK_SERVER:
        raise McpConfigError(
            f"{where}.name: letters, digits, '-' and single '_' (tools are named"
            f" {name}__tool); {MOCK_SERVER!r} is the built-in server"
        )
    url = _value(table, "url", where, (str,)) if "url" in table else None
    command: tuple[str, ...] = ()
    if "command" in table:
        raw = _value(table, "command", where, (list,))
        if not raw or not all(isinstance(part, str) and part for part in raw):
            raise McpConfigError(f"{where}.command: a non-empty list of strings")
        command = tuple(raw)
    if (url is None) == (not command):
        raise McpConfigError(f"{where}: give exactly one of url or command")
    if url is not None and not re.fullmatch(r"https?://[^/?#\s]+\S*", url):
        raise McpConfigError(f"{where}.url: an http:// or https:// URL")
    headers = _value(table, "headers_env", where, (dict,)) if "headers_env" in table else {}
    if not all(isinstance(k, str) and isinstance(v, str) and v for k, v in headers.items()):
        raise McpConfigError(f'{where}.headers_env: a table of header = "ENV_VARIABLE"')
    per_tool = table.get("tool_usd_per_call", {})
    if not isinstance(per_tool, dict):
        raise McpConfigError(f"{where}.tool_usd_per_call: a table of tool = USD")
    timeout = _value(table, "timeout_s", where, (int, float)) if "timeout_s" in table else 60.0
    if not math.isfinite(timeout) or timeout <= 0:
        raise McpConfigError(f"{where}.timeout_s: must be positive")
    return McpServerConfig(
        name=name,
        url=url,
        command=command,
        headers_env=dict(headers),
        usd_per_call=_price(table.get("usd_per_call", 0.0), f"{where}.usd_per_call"),
        tool_usd_per_call={
            str(tool): _price(usd, f"{where}.tool_usd_per_call.{tool}")
            for tool, usd in per_tool.items()
        },
        zero_retention_available=bool(
            _value(table, "zero_retention_available", where, (bool,))
            if "zero_retention_available" in table
            else False
        ),
        timeout_s=float(timeout),
    )


def parse_mcp_servers(tables: Any) -> tuple[McpServerConfig, ...]:
    """The ``[[mcp_servers]]`` array of tables (absent: none)."""
    if tables is None:
        return ()
    if not isinstance(tables, list):
        raise McpConfigError("mcp_servers: must be an array of tables ([[mcp_servers]])")
    servers = tuple(_parse_one(table, i) for i, table in enumerate(tables))
    names = [s.name for s in servers]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise McpConfigError(f"mcp_servers[{i}].name: duplicate server {name!r}")
    return servers
