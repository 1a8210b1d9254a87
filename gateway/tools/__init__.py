"""MCP behind the gateway: the tools of the operator's MCP servers at POST /mcp (issue 44)."""
