"""Serving: one root nursery holds the HTTP server, the store writer and the shards.

    root nursery
      ├─ hypercorn         (nursery.start: bound; only health is served while starting)
      │    start-up work   (gateway.readiness: the rebuild from the store, ...)
      ├─ store writer      (nursery.start)
      ├─ shard pool        (nursery.start)
      ├─ spend alerts      (threshold checks and webhook delivery)
      ├─ last-used flusher
      └─ stream pumps      (one per streamed call, bounded by the call's deadline)
    then READY: ``task_status.started`` hands back the bound addresses

Supervision is structural: if the writer or a shard dies, the exception cancels the
root nursery and with it the HTTP server, so the process never keeps answering with
dead actors. On SIGTERM or SIGINT /readyz turns 503 (STOPPING) at once; after
``drain_s`` hypercorn stops accepting, lets calls in progress finish within
``graceful_timeout_s``, and then the root nursery is cancelled.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Awaitable, Callable

import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.config import Sockets
from hypercorn.trio.run import worker_serve
from hypercorn.utils import wrap_app

from gateway.app import create_app
from gateway.asgi_guard import FinalSendGuard
from gateway.config import Config
from gateway.exchange import ExchangeRecorder
from gateway.logs import event
from gateway.readiness import Phase
from gateway.runtime import Runtime

log = logging.getLogger("gateway.server")
LAST_USED_FLUSH_S = 30.0


def hypercorn_config(gateway_config: Config) -> HyperConfig:
    server = gateway_config.server
    config = HyperConfig()
    host = f"[{server.host}]" if ":" in server.host else server.host
    config.bind = [f"{host}:{server.port}"]
    config.graceful_timeout = server.graceful_timeout_s
    config.keep_alive_max_requests = 1_000_000
    config.keep_alive_timeout = server.connection_idle_s
    # the access log is our "request" event (gateway.exchange); the error log goes
    # through the formatter of gateway.logs like every other logger
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


async def serve(
    runtime: Runtime,
    sockets: Sockets | None = None,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] = wait_for_signal,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the gateway until ``shutdown_trigger`` returns; report the bound URLs once
    the start-up work is done and every part runs (the server is ready)."""
    config = hypercorn_config(runtime.config)
    if sockets is None:
        sockets = bind_sockets(config)
    app = ExchangeRecorder(FinalSendGuard(create_app(runtime)), runtime.metrics)
    app = wrap_app(app, config.wsgi_max_body_size, None)
    readiness = runtime.readiness
    drain_s = runtime.config.server.drain_s

    async def stop_trigger() -> None:
        await shutdown_trigger()
        readiness.phase = Phase.STOPPING
        log.info("stopping", extra=event("shutdown", drain_s=drain_s))
        await trio.sleep(drain_s)

    try:
        async with trio.open_nursery() as root:
            runtime.nursery = root
            started = trio.Event()

            async def http(*, task_status: trio.TaskStatus[list[str]]) -> None:
                await worker_serve(
                    app,
                    config,
                    sockets=sockets,
                    shutdown_trigger=stop_trigger,
                    task_status=task_status,
                )
                if started.is_set():
                    with trio.CancelScope(shield=True):
                        await runtime.keyring.flush_last_used()
                        await runtime.alerts.aclose()  # before the store writer stops
                root.cancel_scope.cancel()

            binds = await root.start(http)
            log.info("starting", extra=event("starting", urls=binds))
            await readiness.start_up()
            await root.start(runtime.store.run)
            await root.start(runtime.pool.run)
            await root.start(runtime.alerts.run)
            root.start_soon(_flush_last_used, runtime)
            started.set()
            readiness.ready()
            log.info("ready", extra=event("ready", urls=binds))
            task_status.started(binds)
    finally:
        with trio.CancelScope(shield=True):
            await runtime.aclose_providers()
        log.info("stopped", extra=event("stopped"))
