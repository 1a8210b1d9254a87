"""The ``[[mcp_servers]]`` tables: the operator's MCP servers the gateway fronts at ``/mcp``.

Each table names one upstream, reached over Streamable HTTP (``url``) or started as a
stdio child (``command``), its credentials from the environment (``headers_env``: header
name → variable), and its price per ``tools/call`` (``usd_per_call``, per tool in
``tool_usd_per_call``). :func:`parse_mcp_servers` raises :class:`ConfigError` naming the
offending key, with the checks every table shares (:mod:`gateway.config.checks`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from gateway.config.checks import ConfigError, check_unknown, http_url, take

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


def _price(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: expected a number of USD")
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{where}: must be a finite non-negative number of USD")
    return float(value)


def _parse_one(table: Any, index: int) -> McpServerConfig:
    where = f"mcp_servers[{index}]"
    check_unknown(table, MCP_SERVER_KEYS, where)
    if "name" not in table:
        raise ConfigError(f"{where}.name: required")
    name = take(table, "name", where, str)
    if not _NAME.fullmatch(name) or name == MOCK_SERVER:
        raise ConfigError(
            f"{where}.name: letters, digits, '-' and single '_' (tools are named"
            f" {name}__tool); {MOCK_SERVER!r} is the built-in server"
        )
    url = take(table, "url", where, str) if "url" in table else None
    command: tuple[str, ...] = ()
    if "command" in table:
        raw = take(table, "command", where, list)
        if not raw or not all(isinstance(part, str) and part for part in raw):
            raise ConfigError(f"{where}.command: a non-empty list of strings")
        command = tuple(raw)
    if (url is None) == (not command):
        raise ConfigError(f"{where}: give exactly one of url or command")
    if url is not None and not http_url(url):
        raise ConfigError(f"{where}.url: an http:// or https:// URL")
    headers = take(table, "headers_env", where, dict) if "headers_env" in table else {}
    if not all(isinstance(k, str) and isinstance(v, str) and v for k, v in headers.items()):
        raise ConfigError(f'{where}.headers_env: a table of header = "ENV_VARIABLE"')
    per_tool = table.get("tool_usd_per_call", {})
    if not isinstance(per_tool, dict):
        raise ConfigError(f"{where}.tool_usd_per_call: a table of tool = USD")
    timeout = take(table, "timeout_s", where, (int, float)) if "timeout_s" in table else 60.0
    if timeout <= 0:
        raise ConfigError(f"{where}.timeout_s: must be positive")
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
            take(table, "zero_retention_available", where, bool)
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
        raise ConfigError("mcp_servers: must be an array of tables ([[mcp_servers]])")
    servers = tuple(_parse_one(table, i) for i, table in enumerate(tables))
    names = [s.name for s in servers]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ConfigError(f"mcp_servers[{i}].name: duplicate server {name!r}")
    return servers
