"""MCP upstreams for the tests: servers built with the official SDK, served for real.

:func:`search_server` is a small MCP server (``MCPServer``) with a priced lookup, a tool
that fails (an ``isError`` result), one that hangs until released, one that echoes
the headers it was sent (to show the caller's key never reaches it) and one that adds a
tool and says ``notifications/tools/list_changed``. :func:`serve_asgi`
serves it (or any ASGI app: :func:`garbage_app` answers something that is not MCP) on a
loopback port 0 under hypercorn's trio worker, in the test's nursery.
"""

from __future__ import annotations

from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from mcp.server.mcpserver import Context, MCPServer


class SearchState:
    """What the search server saw: calls by tool, and a gate the ``hang`` tool waits on."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.release = trio.Event()
        self.hanging = trio.Event()
        self.headers: list[dict[str, str]] = []


def search_server(state: SearchState) -> MCPServer:
    server = MCPServer("search")

    def seen(tool: str) -> None:
        state.calls[tool] = state.calls.get(tool, 0) + 1

    @server.tool()
    def lookup(query: str) -> str:
        """Look a query up."""
        seen("lookup")
        return f"results for {query}"

    @server.tool()
    def broken(query: str) -> str:
        """Always fails."""
        seen("broken")
        raise ValueError("the index is offline")

    @server.tool()
    async def hang() -> str:
        """Waits until the test releases it."""
        seen("hang")
        state.hanging.set()
        await state.release.wait()
        return "released"

    @server.tool()
    def whoami(ctx: Context) -> str:
        """The authorization this server was sent (none, or the operator's)."""
        seen("whoami")
        request = ctx.request_context.request
        headers = dict(request.headers) if request is not None else {}
        state.headers.append(headers)
        return headers.get("authorization", "none")

    @server.tool()
    async def grow(ctx: Context) -> str:
        """Adds the tool ``extra`` and tells the client its tool list changed."""
        seen("grow")

        def extra() -> str:
            """Added by grow."""
            return "extra"

        server.add_tool(extra)
        await ctx.notify_tools_changed()  # 2026-07-28: to subscriptions/listen streams
        await ctx.session.send_tool_list_changed()  # 2025-11-25: on the session
        return "grown"

    return server


async def serve_asgi(app: Any, *, task_status: trio.TaskStatus[str]) -> None:
    """Serve ``app`` on 127.0.0.1, port 0; report its base URL."""
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    await serve(app, config, task_status=task_status)  # type: ignore[arg-type]


async def start_search(nursery: trio.Nursery, state: SearchState) -> str:
    """The search server's /mcp URL."""
    binds: Any = await nursery.start(serve_asgi, search_server(state).streamable_http_app())
    return f"{binds[0]}/mcp"


async def garbage_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers every request 200 with JSON that is no JSON-RPC message."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": b'{"surprise": [1, 2, 3]}'})
