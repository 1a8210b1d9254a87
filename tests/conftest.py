"""Test charter.

- Real parts: a real gateway server on a loopback port chosen by the OS (port 0), a real
  SQLite file in a temp dir, real HTTP (httpx, and the official ``openai`` client).
- Loopback only (127.0.0.1); nothing else is ever a target.
- Time: the shards and key expiry read an injectable clock; tests that depend on the
  minute, the day or the month use ``FakeClock`` instead of sleeping.
- Every I/O test is bounded: pytest-timeout per test, and ``trio.fail_after`` where a
  wait could hang.
- Tests wait on events, not on time: a gateway says when it has stopped
  (:meth:`Gateway.aclose`), the fake upstream when it received a call
  (:meth:`FakeUpstream.received`). A sleep is left only where time itself is the subject.
- A gateway holds its database's one-server lock, as ``serve`` does: a restart test must
  stop the first server before it starts the second.
- No mocks of our own code: the pieces under test run for real.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from gateway.config import Config, default_config, load_config
from gateway.db_lock import DatabaseLock
from gateway.runtime import Runtime
from gateway.server import serve
from shards import FakeClock
from shards.clock import Clock
from tests.fake_upstream import FakeUpstream
from tests.procs import ADMIN_TOKEN as PROCS_ADMIN_TOKEN
from tests.procs import Server, start_server

ADMIN_TOKEN = "test-admin-token"


@dataclass
class Gateway:
    """A running gateway: its URL, its runtime, the demo sandbox token, an admin client."""

    url: str
    runtime: Runtime
    token: str
    stop: trio.Event
    stopped: trio.Event

    async def aclose(self) -> None:
        """Stop the server and return once it has stopped (and released its lock)."""
        self.stop.set()
        await self.stopped.wait()

    @property
    def org_id(self) -> str:
        return next(iter(self.runtime.orgs))

    def client(self, token: str | None = None, **kwargs: Any) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=10.0, **kwargs)

    async def admin(self, method: str, path: str, json: Any = None) -> httpx.Response:
        async with self.client(ADMIN_TOKEN) as client:
            return await client.request(method, path, json=json)

    async def create_key(self, **body: Any) -> dict[str, Any]:
        body.setdefault("org_id", self.org_id)
        body.setdefault("name", "test key")
        body.setdefault("mode", "sandbox")
        response = await self.admin("POST", "/admin/keys", body)
        assert response.status_code == 201, response.text
        return response.json()


def make_config(tmp_path: Path, **server: Any) -> Config:
    return load_config(None, environ={}, db=str(tmp_path / "gateway.db"), port=0, **server)


async def start_gateway(
    nursery: trio.Nursery, config: Config, clock: Clock | None = None
) -> Gateway:
    lock = DatabaseLock(config.server.db)
    lock.acquire()  # one server per database, as `serve` has it
    try:
        runtime = Runtime.open(config, clock=clock)
    except BaseException:
        lock.release()
        raise
    runtime.admin_token = ADMIN_TOKEN
    stop, stopped = trio.Event(), trio.Event()

    async def run(*, task_status: trio.TaskStatus[list[str]]) -> None:
        try:
            await serve(runtime, shutdown_trigger=stop.wait, task_status=task_status)
        finally:
            lock.release()
            stopped.set()

    binds = await nursery.start(run)
    token = runtime.demo_token or ""
    return Gateway(url=binds[0], runtime=runtime, token=token, stop=stop, stopped=stopped)


@pytest.fixture
async def upstream(nursery: trio.Nursery) -> FakeUpstream:
    """The fake OpenAI-compatible upstream (tests/fake_upstream.py), a real server."""
    return await nursery.start(FakeUpstream().serve)


@pytest.fixture
def clock() -> FakeClock:
    # 2026-11-22 10:00:30 UTC: mid-minute, mid-day, mid-month
    return FakeClock(1_795_341_630.0)


@pytest.fixture
async def gateway(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[Gateway]:
    gw = await start_gateway(nursery, make_config(tmp_path))
    yield gw
    gw.stop.set()


@pytest.fixture
async def clocked_gateway(
    nursery: trio.Nursery, tmp_path: Path, clock: FakeClock
) -> AsyncIterator[Gateway]:
    gw = await start_gateway(nursery, make_config(tmp_path), clock=clock)
    yield gw
    gw.stop.set()


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A ``serve`` process of the embedded default (the mock provider), for a module of
    fuzzing tests: generated requests from another process, as a client would send."""
    proc = start_server(tmp_path_factory.mktemp("fuzz"))
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def fuzz_token(fuzz_server: Server) -> str:
    """A sandbox key of the demo organisation with every scope, and limits a fuzzing run
    cannot reach (no 429 noise); its output budget stays small (64) so that generated
    budgets meet the limit too."""
    admin = {"Authorization": f"Bearer {PROCS_ADMIN_TOKEN}"}
    with httpx.Client(base_url=fuzz_server.url, headers=admin) as client:
        org_id = client.get("/admin/orgs").json()["data"][0]["id"]
        body = {
            "org_id": org_id,
            "name": "fuzz",
            "mode": "sandbox",
            "keys_manage": True,
            "caps": {"rpm": 1_000_000, "max_in_flight": 100, "max_output_tokens": 64},
        }
        response = client.post("/admin/keys", json=body)
        assert response.status_code == 201, response.text
        return response.json()["token"]


__all__ = ["ADMIN_TOKEN", "Gateway", "default_config", "make_config", "start_gateway"]
