"""Serving: one root nursery holds the HTTP server, the store writer and the shards.

    root nursery
      ├─ hypercorn         (nursery.start: bound; only health is served while starting,
      │                     and a worker of several accepts nothing until ready;
      │                     at most [server] max_connections open, gateway/serving/connections.py)
      │    start-up work   (gateway.serving.readiness: the rebuild from the store, ...)
      ├─ store writer      (nursery.start)
      ├─ shard pool        (nursery.start)
      ├─ spend alerts      (threshold checks and webhook delivery)
      ├─ MCP upstreams     (a supervised session each: gateway/tools/upstream.py)
      ├─ last-used flusher
      └─ stream pumps      (one per streamed call, bounded by the call's deadline)
    then READY: ``task_status.started`` hands back the bound addresses

Supervision is structural: if the writer or a shard dies, the exception cancels the
root nursery and with it the HTTP server, so the process never keeps answering with
dead actors.

Graceful stop, on SIGTERM or SIGINT: /readyz turns 503 (STOPPING) at once; after
``drain_s`` hypercorn stops accepting, and the calls in progress may finish within
``[server] shutdown_grace_s``; at that deadline every call still running is cut
(:mod:`gateway.calls.inflight`: a 503, or an open stream's in-band service_unavailable
event), hypercorn gives the cut answers ``CUT_MARGIN_S`` to reach their clients, the
server waits until every call is settled (no request row stays pending), and only then
is the root nursery, with the store writer, cancelled.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Awaitable, Callable

import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.config import Sockets

from gateway.calls.streaming import FINAL_SEND_S
from gateway.config.settings import Config
from gateway.edge.app import create_app
from gateway.edge.exchange import ExchangeRecorder
from gateway.observe.logs import event
from gateway.observe.refused_calls import FLUSH_S as REFUSALS_FLUSH_S
from gateway.serving.connections import per_client_limit
from gateway.serving.patches import quart_trio_connection, werkzeug_rules
from gateway.serving.patches.hypercorn_worker import ServerConfig, serve_http
from gateway.serving.readiness import Phase
from gateway.serving.runtime import Runtime

log = logging.getLogger("gateway.serving.server")
LAST_USED_FLUSH_S = 30.0
#: after the grace: how long a cut call has to send its last event and close
CUT_MARGIN_S = FINAL_SEND_S + 1.0
#: once HTTP is closed: how long the calls still in flight (pumps) have to settle
SETTLE_WAIT_S = FINAL_SEND_S + 1.0
#: connections the kernel completes and holds until the server accepts them (Linux caps
#: it at net.core.somaxconn, 4096 by default). hypercorn's 100 overflowed under a burst
#: of 250 connects while the loop was busy: the kernel fell back to SYN cookies and reset
#: some of those clients before a byte was read (TcpExtSyncookiesFailed, TcpOutRsts)
LISTEN_BACKLOG = 4096


def hypercorn_config(gateway_config: Config) -> HyperConfig:
    server = gateway_config.server
    config = ServerConfig()
    host = f"[{server.host}]" if ":" in server.host else server.host
    config.bind = [f"{host}:{server.port}"]
    config.backlog = LISTEN_BACKLOG
    config.graceful_timeout = server.shutdown_grace_s + CUT_MARGIN_S
    config.keep_alive_max_requests = 1_000_000
    config.keep_alive_timeout = server.connection_idle_s
    # the access log is our "request" event (gateway.edge.exchange); the error log goes
    # through the formatter of gateway.observe.logs like every other logger
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    return config


def bind_sockets(config: HyperConfig) -> Sockets:
    """Bind now, so a port in use is reported before anything starts (raises OSError)."""
    sockets = config.create_sockets()
    for sock in (*sockets.secure_sockets, *sockets.insecure_sockets):
        sock.listen(config.backlog)
    return sockets


async def wait_for_signal() -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            name = signal.Signals(signum).name
            log.info("received %s, shutting down", name, extra=event("signal", signal=name))
            return


async def _flush_last_used(runtime: Runtime) -> None:
    while True:
        await trio.sleep(LAST_USED_FLUSH_S)
        await runtime.keyring.flush_last_used()


async def _flush_refusals(runtime: Runtime) -> None:
    while True:
        await trio.sleep(REFUSALS_FLUSH_S)
        await runtime.refusals.flush()


async def _cut_after(runtime: Runtime, grace: float) -> None:
    """The end of the grace: cut every call still in flight."""
    await trio.sleep(grace)
    calls = len(runtime.inflight)
    if calls:
        log.info("grace over: cutting %d calls", calls, extra=event("shutdown_cut", calls=calls))
    runtime.inflight.cut()


async def _settle_in_flight(runtime: Runtime) -> None:
    """HTTP is closed: cut what still runs (stream pumps) and wait until it is settled."""
    runtime.inflight.cut()
    with trio.move_on_after(SETTLE_WAIT_S):
        await runtime.inflight.wait_settled()
    if len(runtime.inflight):
        log.error("stopped with %d calls not settled", len(runtime.inflight))


async def serve(
    runtime: Runtime,
    sockets: Sockets | None = None,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] = wait_for_signal,
    accept_when_ready: bool = False,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the gateway until ``shutdown_trigger`` returns; report the bound URLs once
    the start-up work is done and every part runs (the server is ready).

    With ``accept_when_ready`` (a worker of several on one socket), no connection is
    accepted before then: the kernel hands each one to a worker that waits in
    ``accept``, so a worker still starting would answer 503 where a ready sibling
    serves; the kernel's backlog holds a connection until some worker is ready.

    At most ``[server] max_connections`` clients are served at once: ``svc-gateway
    serve`` has fitted it and the upstream pools to the descriptor limit before building
    the runtime (:func:`gateway.serving.connections.fit_descriptor_limit`)."""
    config = hypercorn_config(runtime.config)
    if sockets is None:
        sockets = bind_sockets(config)
    quart_app = create_app(runtime, werkzeug_rules.LazyBuilders)
    quart_trio_connection.install(quart_app)
    app = ExchangeRecorder(quart_app, runtime.metrics, runtime.spans, runtime.refusals)
    readiness = runtime.readiness
    drain_s = runtime.config.server.drain_s
    grace = runtime.config.server.shutdown_grace_s

    try:
        async with trio.open_nursery() as root:
            runtime.nursery = root
            started = trio.Event()
            opened = started if accept_when_ready else None

            async def stop_trigger() -> None:
                await shutdown_trigger()
                readiness.phase = Phase.STOPPING
                log.info(
                    "stopping", extra=event("shutdown", drain_s=drain_s, shutdown_grace_s=grace)
                )
                await trio.sleep(drain_s)
                # hypercorn stops accepting now: the calls in progress have the grace
                root.start_soon(_cut_after, runtime, grace)

            async def http(*, task_status: trio.TaskStatus[list[str]]) -> None:
                await serve_http(
                    app,
                    config,
                    sockets,
                    runtime.config.server.max_connections,
                    per_client_limit(runtime.config.server),
                    shutdown_trigger=stop_trigger,
                    opened=opened,
                    task_status=task_status,
                )
                if started.is_set():
                    with trio.CancelScope(shield=True):
                        await _settle_in_flight(runtime)
                        await runtime.keyring.flush_last_used()
                        await runtime.refusals.flush()
                        await runtime.alerts.aclose()  # before the store writer stops
                        if runtime.cluster is not None:
                            await runtime.cluster.leave()
                root.cancel_scope.cancel()

            binds = await root.start(http)
            log.info("starting", extra=event("starting", urls=binds))
            await readiness.start_up()
            await root.start(runtime.store.run)
            await root.start(runtime.pool.run)
            await root.start(runtime.call_parts.keepalives.run)
            await root.start(runtime.alerts.run)
            if runtime.cluster is not None:
                await root.start(runtime.cluster.run)
            root.start_soon(_flush_last_used, runtime)
            if runtime.cache is not None:
                root.start_soon(runtime.cache.sweep_forever)
            root.start_soon(_flush_refusals, runtime)
            readiness.ready()
            started.set()
            if runtime.config.mcp_servers:  # else at the first /mcp request
                root.start_soon(runtime.start_tools)  # the MCP SDK, the upstream sessions
            log.info("ready", extra=event("ready", urls=binds))
            task_status.started(binds)
    finally:
        with trio.CancelScope(shield=True):
            await runtime.aclose_providers()
            if runtime.spans is not None:
                await runtime.spans.aclose()  # the last spans, bounded
        log.info("stopped", extra=event("stopped"))
