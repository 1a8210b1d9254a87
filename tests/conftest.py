"""Test charter.

- Real parts: a real gateway server on a loopback port chosen by the OS (port 0), a real
  SQLite file in a temp dir, real HTTP (httpx, and the official ``openai`` client).
- Both stores: a module marked ``both_stores`` runs each test twice, on SQLite and on
  PostgreSQL (a throwaway cluster started once per session by ``pg_cluster``, stopped at
  its end; a database per test). ``db_for(tmp_path)`` names the test's database on the
  test's backend; ``make_config`` uses it.
- Loopback only (127.0.0.1); nothing else is ever a target.
- Time: the shards and key expiry read an injectable clock; tests that depend on the
  minute, the day or the month use ``FakeClock`` instead of sleeping (several nodes on
  one clock: ``clocked_nodes`` of tests/cluster/test_cluster.py). Timers on trio's clock
  are tested on virtual time (``mock_clock``, ``autojump_clock``).
- Every I/O test is bounded: pytest-timeout per test, and ``trio.fail_after`` where a
  wait could hang.
- Tests wait on events, not on time: a gateway says when it has stopped
  (:meth:`Gateway.aclose`), the fake upstream when it received a call
  (:meth:`FakeUpstream.received`), an in-process server that it has done all it can
  (``trio.testing.wait_all_tasks_blocked``). A condition in another process is polled,
  bounded, by ``tests/support/waiting.py``'s ``until``, the one poll loop. A sleep is
  left only in fakes (``gateway/fakes/fake_upstream.py`` and ``fake_client.py``, the
  scripted upstream of ``tests/providers/test_http1.py``: their pace is what a test is
  about), in samplers of what moves by itself (a process's memory, the latency of its
  answers) and on virtual time.
- A gateway holds its database's one-server lock, as ``serve`` does: a restart test must
  stop the first server before it starts the second.
- No mocks of our own code: the pieces under test run for real.
- Parallel: the suite runs on every core (pytest-xdist, ``-n auto`` in pyproject.toml).
  Every test is safe beside any other: ports from the OS, a temp dir per test, one
  PostgreSQL cluster per worker process (``pg_cluster``, session-scoped), no fixed file
  name in the working directory.
- Tiers: a test is ``quick`` (in-process: no PostgreSQL, no process of its own, no
  browser) unless it is marked ``postgres`` (set here for the PostgreSQL half of a
  ``both_stores`` module and for any test that takes ``pg_cluster``), ``processes`` or
  ``browser`` (module marks). A ``quick`` test that starts a process fails, naming the
  mark it lacks (``_quick_starts_no_process``).
"""

from __future__ import annotations

import functools
import gc
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from gateway.config.settings import Config, default_config, load_config
from gateway.fakes.fake_upstream import FakeUpstream
from gateway.serving.db_lock import DatabaseLock
from gateway.serving.runtime import Runtime
from gateway.serving.server import serve
from gateway.store import Store
from gateway.store import sql as store_sql
from shards import FakeClock
from shards.clock import Clock
from tests.support.pg_cluster import Cluster, destroy, find_bin_dir, start_cluster
from tests.support.procs import ADMIN_TOKEN as PROCS_ADMIN_TOKEN
from tests.support.procs import Server, start_server
from tests.support.shared_tls import install as share_one_tls_context
from tests.support.tools import missing_tool

share_one_tls_context()

ADMIN_TOKEN = "test-admin-token"
BACKENDS = ("sqlite", "postgres")


@dataclass
class StoreBackend:
    """The store of the running test: its backend and, on PostgreSQL, the cluster."""

    name: str = "sqlite"
    cluster: Cluster | None = None
    created: set[str] | None = None


#: the current test's backend (tests run one at a time): set by the ``backend`` fixture
STORE = StoreBackend()


@functools.cache
def migrated_sqlite_file() -> bytes:
    """The bytes of a new SQLite database with every migration applied, made once per
    process: a test's database starts as a copy (the migrations' ~300 statements were a
    tenth of a quick test's time). The migrations themselves are tested from an empty
    file in tests/store."""
    with tempfile.TemporaryDirectory(prefix="svc-template-") as folder:
        path = Path(folder) / "template.db"
        Store(str(path)).close()
        return path.read_bytes()


def db_for(tmp_path: Path, name: str = "gateway.db") -> str:
    """The test's database called ``name``: a file in ``tmp_path`` on SQLite (new ones
    start migrated, as a copy of :func:`migrated_sqlite_file`), a database of the
    session's cluster on PostgreSQL (the same one for the same path)."""
    if STORE.name == "sqlite" or STORE.cluster is None or STORE.created is None:
        path = tmp_path / name
        if not path.exists():
            path.write_bytes(migrated_sqlite_file())
        return str(path)
    dbname = "t_" + hashlib.sha256(str(tmp_path / name).encode()).hexdigest()[:16]
    if dbname not in STORE.created:
        STORE.cluster.psql(f"CREATE DATABASE {dbname}")
        STORE.created.add(dbname)
    return STORE.cluster.url(dbname)


def query_db(db: str, sql: str) -> list[dict[str, Any]]:
    """Rows of a query on a database no server holds (after it stopped), either backend."""
    store = Store(db)
    try:
        return store.call(store_sql.query, sql)
    finally:
        store.close()


#: the marks that take a test out of the quick tier, and what each needs
HEAVY_MARKS = ("postgres", "processes", "browser")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "both_stores: run each test of the module on SQLite and on PostgreSQL"
    )
    # Temp dirs (tmp_path: the tests' SQLite files; PostgreSQL's data dir) on tmpfs when
    # the machine has one and TMPDIR names no other place: the store's commits are
    # synchronous=FULL, and their fsyncs on the disk were a third of a quick test's time.
    # pyproject.toml keeps only a failed test's dir (tmp_path_retention_policy). A run
    # writes ~0.5 GB there: a small tmpfs (a container's 64 MB /dev/shm) is left alone.
    shm = "/dev/shm"
    if (
        "TMPDIR" not in os.environ
        and os.access(shm, os.W_OK | os.X_OK)
        and shutil.disk_usage(shm).free >= 2 * 1024**3
    ):
        tempfile.tempdir = shm


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one test worker per core this process may run on, two for ``-m
    quick``. Two per core ran the whole suite faster on a quiet machine (5.0 min against
    7.5 before this round's features), but the cluster races then met CPU starvation (a
    lease renewal late: 503 admission_unavailable) in 2 of 3 whole runs. The quick tier
    has no cluster race (no process, no PostgreSQL) and many waits on the wall clock (a
    deadline, a body's minimum rate): with one worker per core the cores were a third
    idle (2 min 12 s), with two 1 min 33 s."""
    cores = len(os.sched_getaffinity(0))
    return 2 * cores if config.getoption("markexpr", "") == "quick" else cores


#: a module-level mark that takes every test of the module out of the quick tier
_HEAVY_MODULE = re.compile(r"^pytestmark = .*\bpytest\.mark\.(processes|browser)\b", re.M)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under ``-m quick``, a test module marked ``processes`` or ``browser`` on its
    ``pytestmark = ...`` line is not imported: none of its tests could be selected, and
    importing it (schemathesis builds its cases when collected) cost every worker ~5 s."""
    if config.option.markexpr.strip() != "quick" or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_"):
        return None
    return _HEAVY_MODULE.search(collection_path.read_text(encoding="utf-8")) is not None or None


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move what import and collection made (~175,000 objects: the libraries, the test
    items) out of the garbage collector's reach: every full collection walked them
    again (0.1-0.5 s each, some 17 of them in 334 tests: a sixth of their time). The
    tests' own garbage is collected as before."""
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the PostgreSQL tests ``postgres``, and every test with no heavy mark ``quick``."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        on_postgres = callspec is not None and "postgres" in callspec.params.values()
        if on_postgres or "pg_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)
        if not any(item.get_closest_marker(name) for name in HEAVY_MARKS):
            item.add_marker(pytest.mark.quick)


@pytest.fixture(autouse=True)
def _quick_starts_no_process(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A quick test runs in-process: starting a process fails it, naming the mark it
    needs (``processes``, or ``browser``), so the quick tier stays quick."""
    if request.node.get_closest_marker("quick") is None:
        return

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(
            f"{request.node.nodeid} is marked quick but starts a process ({args[:1]}):"
            " mark its module processes (or browser)"
        )

    monkeypatch.setattr(subprocess, "Popen", refuse)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames and metafunc.definition.get_closest_marker("both_stores"):
        metafunc.parametrize("backend", BACKENDS, indirect=True)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    """A throwaway PostgreSQL cluster for the session: started on first use, stopped at
    the session's end however it ends."""
    bin_dir = find_bin_dir()
    if bin_dir is None:
        missing_tool("postgresql", "initdb, pg_ctl and psql not found")
    cluster = start_cluster(bin_dir)
    try:
        yield cluster
    finally:
        destroy(cluster)


@pytest.fixture(autouse=True)
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """The store backend of this test (``sqlite`` unless the module is ``both_stores``)."""
    name = getattr(request, "param", "sqlite")
    cluster = request.getfixturevalue("pg_cluster") if name == "postgres" else None
    created = STORE.created if STORE.cluster is cluster and STORE.created else set()
    STORE.name, STORE.cluster, STORE.created = name, cluster, created
    try:
        yield name
    finally:
        STORE.name = "sqlite"


@dataclass
class Gateway:
    """A running gateway: its URL, its runtime, the demo sandbox token, an admin client."""

    url: str
    runtime: Runtime
    token: str
    stop: trio.Event
    stopped: trio.Event

    async def aclose(self) -> None:
        """Stop the server and return once it has stopped (its store closed, its lock
        released: a next server may open the database)."""
        self.stop.set()
        await self.stopped.wait()

    @property
    def org_id(self) -> str:
        return next(iter(self.runtime.orgs))

    def client(self, token: str | None = None, **kwargs: Any) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        kwargs.setdefault("timeout", 10.0)
        return httpx.AsyncClient(base_url=self.url, headers=headers, **kwargs)

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
    return load_config(None, environ={}, db=db_for(tmp_path), port=0, **server)


async def start_gateway(
    nursery: trio.Nursery,
    config: Config,
    clock: Clock | None = None,
    admin_token: str = ADMIN_TOKEN,
) -> Gateway:
    lock = DatabaseLock(config.server.db)
    lock.acquire()  # one server per database, as `serve` has it
    try:
        runtime = Runtime.open(config, clock=clock)
    except BaseException:
        lock.release()
        raise
    runtime.admin_token = admin_token
    stop, stopped = trio.Event(), trio.Event()

    async def run(*, task_status: trio.TaskStatus[list[str]]) -> None:
        try:
            await serve(runtime, shutdown_trigger=stop.wait, task_status=task_status)
        finally:
            runtime.store.close()
            lock.release()
            stopped.set()

    binds = await nursery.start(run)
    token = runtime.demo_token or ""
    return Gateway(url=binds[0], runtime=runtime, token=token, stop=stop, stopped=stopped)


@pytest.fixture
async def upstream(nursery: trio.Nursery) -> FakeUpstream:
    """The fake OpenAI-compatible upstream (gateway/fakes/fake_upstream.py), a real server."""
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


__all__ = [
    "ADMIN_TOKEN",
    "STORE",
    "Gateway",
    "db_for",
    "default_config",
    "make_config",
    "query_db",
    "start_gateway",
]
