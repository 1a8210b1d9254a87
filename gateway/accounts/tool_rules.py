"""Which MCP tools a key may call: tool names, patterns, and the rule that refuses one.

A tool behind the gateway is named ``server__tool`` (its server's name, two underscores,
its own name). A pattern is a full name, or ``server__*`` for every tool of a server.
A key's ``allowed_tools`` (None: every tool) and the organisation's policy key
``org_blocked_tools`` decide, as pure functions, here; ``gateway/tools/`` asks them for
``tools/list`` (only what may be called is shown) and again for each ``tools/call``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from gateway.errors import GatewayError

SEPARATOR = "__"
_PART = r"[A-Za-z0-9][A-Za-z0-9-]*(?:_[A-Za-z0-9-]+)*"
#: a tool pattern: server__tool or server__* (the document writes it too)
PATTERN_SYNTAX = rf"{_PART}__(?:\*|\S+)"
_PATTERN = re.compile(PATTERN_SYNTAX)


def full_name(server: str, tool: str) -> str:
    return f"{server}{SEPARATOR}{tool}"


def split_name(name: str) -> tuple[str, str] | None:
    """``(server, tool)`` of a full tool name; None when it names no server."""
    server, sep, tool = name.partition(SEPARATOR)
    return (server, tool) if sep and server and tool else None


def matches(pattern: str, name: str) -> bool:
    if pattern.endswith(SEPARATOR + "*"):
        return name.startswith(pattern[:-1])
    return pattern == name


def check_tool_patterns(patterns: Iterable[str], param: str) -> tuple[str, ...]:
    """The patterns, checked (400 invalid_request naming ``param``), duplicates dropped."""
    checked = tuple(dict.fromkeys(patterns))
    bad = [p for p in checked if not _PATTERN.fullmatch(p)]
    if bad:
        raise GatewayError(
            "invalid_request",
            f"{bad[0]!r} is not a tool pattern; write server__tool or server__*.",
            param=param,
        )
    return checked


def covered(patterns: Sequence[str] | None, pattern: str) -> bool:
    """Whether every tool ``pattern`` names is within ``patterns`` (None: every tool)."""
    if patterns is None:
        return True
    if pattern.endswith(SEPARATOR + "*"):
        return pattern in patterns
    return any(matches(p, pattern) for p in patterns)


def refusing_rule(allowed: Sequence[str] | None, blocked: Sequence[str], name: str) -> str | None:
    """The rule that keeps a key from ``name``, or None when the key may call it: the
    organisation's ``org_blocked_tools`` first, then the key's ``allowed_tools``."""
    for pattern in blocked:
        if matches(pattern, name):
            return f"org_blocked_tools: {pattern}"
    if allowed is not None and not any(matches(p, name) for p in allowed):
        return "allowed_tools"
    return None
