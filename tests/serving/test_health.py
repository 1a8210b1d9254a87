"""GET /healthz and GET /readyz against a real server: each phase and each unready reason."""

from __future__ import annotations

import logging
import threading
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from gateway.serving.readiness import Phase, unready_reason
from gateway.serving.runtime import Runtime
from gateway.serving.server import bind_sockets, hypercorn_config, serve
from tests.conftest import ADMIN_TOKEN, Gateway, make_config

HEALTH_PATHS = ("/healthz", "/readyz", "/metrics")


async def get(url: str, path: str, token: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
        return await client.get(path, headers=headers)


async def test_healthz_and_readyz_answer_without_a_key(gateway: Gateway) -> None:
    health = await get(gateway.url, "/healthz")
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    ready = await get(gateway.url, "/readyz")
    assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
    assert ready.headers["Cache-Control"] == "no-store"


@pytest.mark.parametrize("path", HEALTH_PATHS)
@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE", "HEAD"])
async def test_other_methods_are_405(gateway: Gateway, path: str, method: str) -> None:
    async with gateway.client() as client:
        response = await client.request(method, path)
    assert response.status_code == 405
    if method != "HEAD":
        assert response.json()["error"]["code"] == "method_not_allowed"


class Served:
    """A server run by the test itself: its URL, and events for ready and done."""

    def __init__(self, nursery: trio.Nursery, runtime: Runtime) -> None:
        config = runtime.config
        sockets = bind_sockets(hypercorn_config(config))
        host, port = sockets.insecure_sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"
        self.stop, self.ready, self.done = trio.Event(), trio.Event(), trio.Event()
        runtime.admin_token = ADMIN_TOKEN

        async def run() -> None:
            try:
                async with trio.open_nursery() as inner:
                    await inner.start(
                        partial(serve, runtime, sockets, shutdown_trigger=self.stop.wait)
                    )
                    self.ready.set()
            finally:
                self.done.set()

        nursery.start_soon(run)


async def test_readyz_is_503_while_start_up_work_runs(
    nursery: trio.Nursery, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Start-up work (the rebuild, then a step the test holds) runs while hypercorn
    already answers: /healthz ok, /readyz starting (logged and counted with the code
    ``unready``, never ``internal_error``), every other path 503."""
    caplog.set_level(logging.INFO, logger="gateway.request")
    runtime = Runtime.open(make_config(tmp_path))
    release = trio.Event()
    runtime.readiness.startup.append(release.wait)
    server = Served(nursery, runtime)
    try:
        health = await get(server.url, "/healthz")
        assert (health.status_code, health.json()) == (200, {"status": "ok"})
        starting = await get(server.url, "/readyz")
        assert starting.status_code == 503
        assert starting.json() == {"status": "unready", "reason": "starting"}
        lines = [r.getMessage() for r in caplog.records if "/readyz" in r.getMessage()]
        assert lines == ["GET /readyz 503 unready"], lines
        scraped = (await get(server.url, "/metrics")).text
        assert 'svc_requests_total{code="unready",endpoint="other",status="503"} 1.0' in scraped
        refused = await get(server.url, "/v1/models")
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "service_unavailable"
        assert refused.headers["Retry-After"] == "1"
        assert (await get(server.url, "/metrics")).status_code == 200
        assert not server.ready.is_set()
        release.set()
        with trio.fail_after(10):
            await server.ready.wait()
        ok = await get(server.url, "/readyz")
        assert (ok.status_code, ok.json()) == (200, {"status": "ready"})
        assert runtime.demo_token is not None
        assert (await get(server.url, "/v1/key", runtime.demo_token)).status_code == 200
    finally:
        release.set()
        server.stop.set()


async def test_readyz_is_503_once_a_graceful_stop_began(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    """From the stop on, /readyz says stopping; for drain_s everything else is still
    served (a balancer moves away first); then the server stops."""
    runtime = Runtime.open(make_config(tmp_path, drain_s=2.0))
    server = Served(nursery, runtime)
    with trio.fail_after(10):
        await server.ready.wait()
    assert (await get(server.url, "/readyz")).status_code == 200
    server.stop.set()
    await trio.testing.wait_all_tasks_blocked()
    assert runtime.readiness.phase is Phase.STOPPING
    stopping = await get(server.url, "/readyz")
    assert stopping.status_code == 503
    assert stopping.json() == {"status": "unready", "reason": "stopping"}
    assert (await get(server.url, "/healthz")).status_code == 200
    assert runtime.demo_token is not None
    assert (await get(server.url, "/v1/key", runtime.demo_token)).status_code == 200
    with trio.fail_after(15):
        await server.done.wait()
    with pytest.raises(httpx.ConnectError):
        await get(server.url, "/healthz")


async def test_readyz_is_503_when_the_store_does_not_answer(gateway: Gateway) -> None:
    """A read that holds the store's read connection (a long query) past the bound."""
    entered, release = threading.Event(), threading.Event()

    def long_read(_conn: Any) -> None:
        entered.set()
        release.wait(30)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(gateway.runtime.store.read, long_read)
        try:
            await trio.to_thread.run_sync(entered.wait, 10)
            with trio.fail_after(10):
                busy = await get(gateway.url, "/readyz")
            assert busy.status_code == 503
            assert busy.json() == {"status": "unready", "reason": "store_unavailable"}
        finally:
            release.set()
    ok = await get(gateway.url, "/readyz")
    assert (ok.status_code, ok.json()) == (200, {"status": "ready"})


@pytest.mark.parametrize(
    ("phase", "shards", "store", "reason"),
    [
        (Phase.STARTING, True, True, "starting"),
        (Phase.STARTING, False, False, "starting"),
        (Phase.STOPPING, True, True, "stopping"),
        (Phase.READY, False, True, "shard_down"),
        (Phase.READY, False, False, "shard_down"),
        (Phase.READY, True, False, "store_unavailable"),
        (Phase.READY, True, True, None),
    ],
)
def test_the_first_unready_reason_is_given(
    phase: Phase, shards: bool, store: bool, reason: str | None
) -> None:
    assert unready_reason(phase, shards, store) == reason
