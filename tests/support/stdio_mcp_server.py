"""A stdio MCP server built with the SDK, for the gateway's supervision tests.

``pid`` answers the server's process id (a restart shows as a new one), ``crash`` ends
the process at once (as a server that dies mid-call).
"""

from __future__ import annotations

import os

from mcp.server.mcpserver import MCPServer

server = MCPServer("stdio-test")


@server.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


@server.tool()
def crash() -> str:
    """Dies mid-call."""
    os._exit(3)


if __name__ == "__main__":
    server.run()
