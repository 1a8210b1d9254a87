"""One upstream MCP server as the gateway holds it: a supervised session and its tool list.

    UpstreamLink.run  (a task of the server's root nursery, one per upstream)
      loop
        open a session with the official ``mcp`` client: Streamable HTTP (the headers of
          ``headers_env``, read from the environment: never the caller's key), a stdio
          child (under :mod:`gateway.tools.orphan_guard`: it dies with this process), or
          the built-in mock in-process; the protocol revision negotiated by the SDK
        CONNECTED: calls share the session (JSON-RPC ids keep them apart)
        ping every ``PING_S``; a failed ping, or a call that found the connection gone,
          closes it (a stdio child that died is started again this way)
        DOWN: wait (``RETRY_S`` doubling to ``RETRY_MAX_S``, or at once when a call asks)

A call that finds no session waits for one connection attempt, then fails naming the
server (:class:`UpstreamFailure`): the walk answers it as an ``isError`` result.
The tool list is cached for ``TOOLS_MAX_AGE_S`` at most and dropped when the server says
its tools changed: ``notifications/tools/list_changed`` (2025-11-25), or an event on the
``subscriptions/listen`` stream the link keeps open (2026-07-28, where that is the only
way a change reaches a client); it is never fetched per call.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
import trio
from mcp import Client, StdioServerParameters
from mcp.client.session import IncomingMessage
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import Implementation, ToolListChangedNotification
from mcp_types.jsonrpc import CONNECTION_CLOSED
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from gateway import __version__
from gateway.config.mcp_servers import McpServerConfig
from gateway.observe.logs import event

log = logging.getLogger("gateway.tools")

PING_S = 5.0
CONNECT_S = 10.0
RETRY_S = 0.5
RETRY_MAX_S = 10.0
TOOLS_MAX_AGE_S = 60.0
STREAM_READ_S = 300.0
#: connections to one upstream: the calls in flight are bounded by the keys' slots
_POOL = httpx2.Limits(max_connections=1000, max_keepalive_connections=100)
#: the mode the SDK's client negotiates: server/discover, else the initialize handshake
_AUTO = "auto"
_CLIENT_INFO = Implementation(name="svc-gateway", version=__version__)


class UpstreamFailure(Exception):
    """An upstream that could not serve a call, in words a caller may read.

    ``reached``: the request may have reached the server (a timeout, a connection lost
    after sending, an answer that was not MCP), so it may have done the work."""

    def __init__(self, server: str, reason: str, reached: bool) -> None:
        super().__init__(server, reason)
        self.server, self.reason, self.reached = server, reason, reached

    def __str__(self) -> str:
        return f"The MCP server {self.server!r} {self.reason}."


#: the SDK's and its transports' failures, most specific first: the words, and whether
#: the request may have reached the server
_FAILURES: tuple[tuple[type[BaseException], str, bool], ...] = (
    (ValidationError, "answered something that is not MCP", True),
    (httpx2.ConnectError, "is unreachable", False),
    (httpx2.TimeoutException, "did not answer in time", True),
    (httpx2.HTTPError, "failed over HTTP", True),
    (anyio.ClosedResourceError, "closed the connection", True),
    (anyio.BrokenResourceError, "closed the connection", True),
    (anyio.EndOfStream, "closed the connection", True),
    (OSError, "is unreachable", False),
    (ValueError, "answered something that is not MCP", True),
)


def _failure(server: str, exc: BaseException) -> UpstreamFailure:
    leaves = exc.exceptions if isinstance(exc, BaseExceptionGroup) else (exc,)
    for leaf in leaves:
        if isinstance(leaf, MCPError):
            return UpstreamFailure(server, f"answered an error: {leaf.message[:200]}", True)
    for kind, reason, reached in _FAILURES:
        if any(isinstance(leaf, kind) for leaf in leaves):
            return UpstreamFailure(server, reason, reached)
    return UpstreamFailure(server, "failed", True)


def _dump(model: Any) -> dict[str, Any]:
    dumped: dict[str, Any] = model.model_dump(by_alias=True, exclude_none=True, mode="json")
    return dumped


async def _probe(client: Client) -> None:
    """Whether the connection still carries messages: ``ping`` (2025-11-25), or
    ``server/discover`` (2026-07-28, which has no ping)."""
    if client.protocol_version in MODERN_PROTOCOL_VERSIONS:
        await client.session.discover()
    else:
        await client.send_ping()


class UpstreamLink:
    """One upstream: ``run`` keeps its session; ``tools`` and ``call`` use it."""

    def __init__(
        self,
        config: McpServerConfig,
        *,
        in_process: MCPServer | None = None,
        environ: Mapping[str, str] = os.environ,
    ) -> None:
        self.config = config
        self._in_process = in_process
        self._environ = environ
        self._client: Client | None = None
        #: why the last connection attempt failed (None: connected, or not tried yet)
        self._down: UpstreamFailure | None = None
        self._changed = trio.Event()
        self._wanted = trio.Event()
        self._broken = trio.Event()
        self._tools: list[dict[str, Any]] | None = None
        self._tools_at = -math.inf

    @property
    def name(self) -> str:
        return self.config.name

    # -- the session -----------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        return {
            header: value
            for header, variable in self.config.headers_env.items()
            if (value := self._environ.get(variable)) is not None
        }

    @asynccontextmanager
    async def _open(self) -> AsyncIterator[Client]:
        """A session with the upstream, by its kind."""
        options: dict[str, Any] = {
            "cache": None,
            "client_info": _CLIENT_INFO,
            "message_handler": self._heard,
        }
        if self._in_process is not None:
            async with Client(self._in_process, mode="2026-07-28", **options) as client:
                yield client
            return
        if self.config.url is not None:
            # a call's own deadline is the walk's (timeout_s); the read timeout only bounds
            # the idle server stream of a 2025-11-25 session
            timeout = httpx2.Timeout(CONNECT_S, read=STREAM_READ_S)
            async with httpx2.AsyncClient(
                headers=self._headers(), timeout=timeout, limits=_POOL
            ) as http:
                transport = streamable_http_client(self.config.url, http_client=http)
                async with Client(transport, mode=_AUTO, **options) as client:
                    yield client
            return
        variables = {
            v: self._environ[v] for v in self.config.headers_env.values() if v in self._environ
        }
        guarded = StdioServerParameters(
            command=sys.executable,
            args=["-m", "gateway.tools.orphan_guard", *self.config.command],
            env=variables,
        )
        async with Client(guarded, mode=_AUTO, **options) as client:
            yield client

    async def _heard(self, message: IncomingMessage) -> None:
        if isinstance(getattr(message, "root", message), ToolListChangedNotification):
            self._tools_at = -math.inf

    def _moved(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep a session with the upstream until cancelled (the server's stop)."""
        task_status.started()
        wait = RETRY_S
        while True:
            self._broken = trio.Event()
            with trio.CancelScope(deadline=trio.current_time() + CONNECT_S) as scope:
                try:
                    async with self._open() as client:
                        scope.deadline = math.inf
                        self._client, self._down = client, None
                        self._moved()
                        log.info("mcp upstream up", extra=event("mcp_upstream", server=self.name))
                        wait = RETRY_S
                        async with trio.open_nursery() as listening:
                            if client.protocol_version in MODERN_PROTOCOL_VERSIONS:
                                listening.start_soon(self._listen, client)
                            await self._keep(client)
                            listening.cancel_scope.cancel()
                except Exception as exc:  # the upstream's failure, whatever its library
                    self._down = _failure(self.name, exc)
                finally:
                    self._client = None
            if scope.cancelled_caught:
                self._down = UpstreamFailure(self.name, "did not answer in time", False)
            log.warning(
                "mcp upstream down",
                extra=event("mcp_upstream", server=self.name, error=str(self._down)),
            )
            self._moved()
            self._wanted = trio.Event()
            with trio.move_on_after(wait):
                await self._wanted.wait()
            wait = min(wait * 2, RETRY_MAX_S)

    async def _keep(self, client: Client) -> None:
        """Serve calls over ``client`` until a call found it broken or a ping could not
        be sent (a closed connection: a stdio child that died). A ping answered with an
        error (2026-07-28 has no ping method) or slow under load leaves it open."""
        while True:
            with trio.move_on_after(PING_S):
                await self._broken.wait()
                return
            with trio.move_on_after(PING_S):
                try:
                    await _probe(client)
                except MCPError as answered:
                    if answered.code == CONNECTION_CLOSED:
                        return

    async def _listen(self, client: Client) -> None:
        """Drop the cached tool list on each change the upstream announces (2026-07-28).
        A stream that ends is opened again; an upstream that cannot listen keeps the
        max-age rule."""
        while True:
            try:
                async with client.listen(tools_list_changed=True) as changes:
                    if not changes.honored.tools_list_changed:
                        return
                    async for _ in changes:
                        self._tools_at = -math.inf
            except Exception as exc:  # the upstream's failure, whatever its library
                log.info(
                    "mcp upstream: no tool-change stream",
                    extra=event("mcp_upstream", server=self.name, error=type(exc).__name__),
                )
                return
            self._tools_at = -math.inf  # a change may have come between two streams
            await trio.sleep(RETRY_S)

    def _lost(self, exc: Exception) -> None:
        """A call's failure: a connection that is gone is opened again."""
        if not isinstance(exc, MCPError) or exc.code == CONNECTION_CLOSED:
            self._broken.set()

    async def _session(self) -> Client:
        """The session, after at most one connection attempt; else the failure."""
        asked = False
        while self._client is None:
            if asked and self._down is not None:
                raise self._down
            asked = True
            changed = self._changed
            self._wanted.set()
            await changed.wait()
        return self._client

    # -- what calls use --------------------------------------------------------------------

    async def tools(self, now: float) -> list[dict[str, Any]]:
        """The upstream's tools (their wire dicts), from the cache while fresh."""
        if self._tools is not None and now - self._tools_at < TOOLS_MAX_AGE_S:
            return self._tools
        try:
            with trio.fail_after(self.config.timeout_s):
                client = await self._session()
                found: list[dict[str, Any]] = []
                cursor: str | None = None
                while True:
                    page = await client.list_tools(cursor=cursor)
                    found.extend(_dump(tool) for tool in page.tools)
                    cursor = page.next_cursor
                    if cursor is None:
                        break
        except UpstreamFailure:
            raise
        except trio.TooSlowError:
            raise UpstreamFailure(self.name, "did not list its tools in time", True) from None
        except Exception as exc:  # the upstream's failure, whatever its library
            self._lost(exc)
            raise _failure(self.name, exc) from None
        self._tools, self._tools_at = found, now
        return found

    async def call(self, tool: str, arguments: dict[str, Any] | None) -> dict[str, Any]:
        """``tools/call`` on the upstream, within its ``timeout_s``: the result's wire dict."""
        try:
            with trio.fail_after(self.config.timeout_s):
                client = await self._session()
                result = await client.call_tool(tool, arguments)
        except UpstreamFailure:
            raise
        except trio.TooSlowError:
            raise UpstreamFailure(
                self.name, f"did not answer within {self.config.timeout_s:g} s", True
            ) from None
        except Exception as exc:  # the upstream's failure, whatever its library
            self._lost(exc)
            raise _failure(self.name, exc) from None
        answer = _dump(result)
        answer.pop("_meta", None)
        answer.pop("resultType", None)
        return answer
