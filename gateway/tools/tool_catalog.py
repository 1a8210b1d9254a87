"""The aggregated tool catalog: every upstream's tools under ``server__tool`` names.

Which servers a key reaches: sandbox keys only the built-in ``mock``; live keys the
operator's ``[[mcp_servers]]``; a zero_retention key only the servers with
``zero_retention_available``. Of those tools, a key sees and calls those that neither
``org_blocked_tools`` nor its ``allowed_tools`` refuse
(:func:`gateway.accounts.tool_rules.refusing_rule`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from gateway.accounts.key_record import KeyRecord
from gateway.accounts.orgs import Org
from gateway.accounts.tool_rules import full_name, refusing_rule, split_name
from gateway.config.mcp_servers import McpServerConfig
from gateway.errors import GatewayError
from gateway.observe.logs import event
from gateway.tools.mock_server import MOCK_CONFIG, mock_server
from gateway.tools.upstream import UpstreamFailure, UpstreamLink

log = logging.getLogger("gateway.tools")


def blocked_tools(org: Org | None) -> Sequence[str]:
    """The organisation's ``org_blocked_tools`` patterns."""
    listed = org.policy.get("org_blocked_tools") if org is not None else None
    return listed if isinstance(listed, list) else ()


@dataclass(frozen=True, slots=True)
class ResolvedTool:
    """A tool a key may call: its server, its upstream name, its full name and price."""

    link: UpstreamLink
    tool: str
    name: str
    usd: float


class ToolCatalog:
    def __init__(self, servers: Sequence[McpServerConfig], environ: Mapping[str, str]) -> None:
        self.mock = UpstreamLink(MOCK_CONFIG, in_process=mock_server())
        self.links = {s.name: UpstreamLink(s, environ=environ) for s in servers}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep every upstream's session (until the server's stop cancels them)."""
        async with trio.open_nursery() as nursery:
            for link in (self.mock, *self.links.values()):
                await nursery.start(link.run)
            task_status.started()

    def reachable(self, record: KeyRecord) -> list[UpstreamLink]:
        """The servers ``record`` reaches (before the tool rules)."""
        if record.mode == "sandbox":
            return [self.mock]
        links = list(self.links.values())
        if record.data_mode != "standard":
            links = [link for link in links if link.config.zero_retention_available]
        return links

    async def listed(self, record: KeyRecord, org: Org | None, now: float) -> list[dict[str, Any]]:
        """``tools/list`` for ``record``: the tools it may call, renamed ``server__tool``.
        A server that cannot list its tools is left out (and logged), never the answer."""
        blocked = blocked_tools(org)
        found: dict[str, list[dict[str, Any]]] = {}

        async def collect(link: UpstreamLink) -> None:
            try:
                found[link.name] = await link.tools(now)
            except UpstreamFailure as failure:
                log.warning("mcp tools not listed", extra=event("mcp_upstream", error=str(failure)))

        links = self.reachable(record)
        async with trio.open_nursery() as nursery:
            for link in links:
                nursery.start_soon(collect, link)
        shown = []
        for link in links:
            for tool in found.get(link.name, ()):
                name = full_name(link.name, str(tool.get("name")))
                if refusing_rule(record.allowed_tools, blocked, name) is None:
                    shown.append({**tool, "name": name})
        return shown

    def resolve(self, record: KeyRecord, org: Org | None, name: str) -> ResolvedTool:
        """The tool ``name`` as ``record`` may call it, or the refusal naming the rule."""
        parts = split_name(name)
        link = None
        if parts is not None:
            link = next((x for x in self.reachable(record) if x.name == parts[0]), None)
        if parts is None or link is None:
            raise GatewayError(
                "tool_not_found",
                f"No tool {name!r} behind this gateway for this key; tools/list shows the"
                " tools it may call (named server__tool).",
                param="name",
            )
        rule = refusing_rule(record.allowed_tools, blocked_tools(org), name)
        if rule is not None:
            raise GatewayError(
                "tool_not_allowed",
                f"This key may not call {name} (refused by {rule}); ask your administrator.",
                param="name",
                svc={"policy": {"decisions": [{"rule": rule, "verdict": "deny"}]}},
            )
        return ResolvedTool(link, parts[1], name, link.config.price_usd(parts[1]))
