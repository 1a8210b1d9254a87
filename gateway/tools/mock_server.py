"""The built-in ``mock`` MCP server: the only one sandbox keys reach.

Deterministic tools, served in-process through the SDK's direct dispatcher (no socket,
no child): the same answer for the same arguments, every time, on every node. Priced
like any server (``MOCK_USD_PER_CALL``) so sandbox keys meet their caps at that price,
as sandbox model calls do at catalog prices; sandbox calls are never billed.
"""

from __future__ import annotations

import hashlib

from mcp.server.mcpserver import MCPServer

from gateway.config.mcp_servers import MOCK_SERVER, McpServerConfig

MOCK_USD_PER_CALL = 0.001
MOCK_CONFIG = McpServerConfig(name=MOCK_SERVER, usd_per_call=MOCK_USD_PER_CALL, timeout_s=10.0)


def mock_server() -> MCPServer:
    server = MCPServer(MOCK_SERVER, instructions="Deterministic tools for sandbox keys.")

    @server.tool()
    def echo(text: str) -> str:
        """Answer the text as it came."""
        return text

    @server.tool()
    def add(a: float, b: float) -> float:
        """Add two numbers."""
        return a + b

    @server.tool()
    def digest(text: str) -> str:
        """The SHA-256 of the text, hex (a stand-in for a tool with a real answer)."""
        return hashlib.sha256(text.encode()).hexdigest()

    return server
