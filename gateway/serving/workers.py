"""Several serving processes on one port: ``serve --workers N`` with N > 1.

The parent binds the listening sockets once (``svc-gateway serve`` did, before this
runs) and forks N workers that inherit them: the kernel hands each new connection to
one of the workers waiting on the socket. Each worker is a whole server (its shards,
its store connections, hypercorn) and one node of the deployment
(:mod:`gateway.serving.node`), named ``<[cluster] node_id>-w<i>``: the lease protocol
of several nodes keeps every cap, balance, budget, rate window and in-flight limit
exact across them. Worker 0 starts first (on an empty database it makes the demo
data), the others once it is ready; the parent announces the server once all are.
A worker accepts connections only once it is ready (``serve(accept_when_ready=True)``):
one starting (a restart, or the group's start) leaves every connection to a ready
sibling, or to the kernel's backlog until one is, never a 503 "starting".

The parent runs no event loop and opens no database: it waits for signals
(``sigtimedwait``, the signals blocked) and reaps its children.

- A worker that ends while the group serves is started again, after 0.5 s doubling
  up to 30 s while it keeps ending within ``STABLE_S`` of its start. The parent saw
  its predecessor end, so the new worker takes the node id over at once
  (:func:`gateway.store.node_leases.take_over`: the predecessor's pending rows are
  settled by recovery and its leases dropped) instead of waiting for it to expire.
- SIGTERM or SIGINT to the parent: SIGTERM to every worker (each stops gracefully:
  :mod:`gateway.serving.server`), then the parent waits for them, up to the drain,
  the grace and a margin; a worker still running then is killed.
- A worker that cannot start during the group's start-up stops the group
  (:class:`WorkersError`: ``serve`` exits 1).

The group's metrics: before the first fork the parent makes a directory for
prometheus-client's multiprocess files (``PROMETHEUS_MULTIPROC_DIR``, inherited by every
worker; :mod:`gateway.observe.metrics`), keeps it while the group runs, whatever its
workers do, and removes it at the end. It tells the metrics of each worker it reaps.

Workers run in their own process group (a terminal's Ctrl-C reaches the parent only,
which forwards one SIGTERM) and, on Linux, end with the parent if it is killed.

On PostgreSQL the workers are nodes like any other. On SQLite they are nodes of one
file: the lease protocol runs there too (a refill is one ``BEGIN IMMEDIATE``
transaction; :mod:`gateway.store.node_leases`), and the one-server lock
(:mod:`gateway.serving.db_lock`) is the group's: ``svc-gateway serve`` took it in the
parent before the workers were forked, and they inherit it.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import NoReturn

import orjson
import trio
from hypercorn.config import Sockets

from gateway.config.settings import Config
from gateway.observe.logs import event
from gateway.observe.metrics import SHARED_DIR_ENV, forget_worker
from gateway.serving.heap import settle_heap
from gateway.serving.runtime import Runtime
from gateway.serving.server import CUT_MARGIN_S, SETTLE_WAIT_S, serve
from gateway.store import StoreError

log = logging.getLogger("gateway.serving.workers")
#: a worker that ran this long before it ended is restarted after the first backoff
STABLE_S = 30.0
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0
#: how often the parent looks at its workers when no signal comes
TICK_S = 0.2
#: past the drain and the grace: how long the parent waits for its workers to stop
STOP_MARGIN_S = CUT_MARGIN_S + SETTLE_WAIT_S + 5.0
_SIGNALS = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT}
_PR_SET_PDEATHSIG = 1

#: what the parent announces once every worker is ready: (url, database, sandbox key)
Announce = Callable[[str, str, "str | None"], None]


class WorkersError(Exception):
    """The workers cannot run: the message says why and what to do instead."""


def check_workers(config: Config) -> None:
    """Raise :class:`WorkersError` when ``config`` asks for workers it cannot have."""
    if config.server.workers > 1 and config.server.db == ":memory:":
        raise WorkersError(
            f"--workers {config.server.workers}: several workers share a database file or a"
            " PostgreSQL database, not :memory: (use --db FILE, or workers = 1)"
        )


@dataclass
class _Worker:
    index: int
    node_id: str
    pid: int = 0
    #: the read end of the pipe on which the worker reports that it is ready
    ready_fd: int = -1
    buffer: bytes = b""
    ready: dict[str, str | None] | None = None
    started_at: float = 0.0
    #: consecutive ends within STABLE_S of a start
    failures: int = 0
    #: when to start it again (time.monotonic()), once it ended
    restart_at: float | None = None


def run_workers(config: Config, sockets: Sockets, *, demo: bool, announce: Announce) -> None:
    """Run ``[server] workers`` workers on ``sockets`` until SIGTERM or SIGINT, then stop
    them; :class:`WorkersError` when the group could not start."""
    group = _Group(config, sockets)
    # blocked for good: taken by sigtimedwait, and the process ends after the group (a
    # signal sent during or after the stop must not end it before its workers)
    signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    metrics_dir = tempfile.mkdtemp(prefix="svc-gateway-metrics-")
    os.environ[SHARED_DIR_ENV] = metrics_dir
    try:
        group.run(demo=demo, announce=announce)
    finally:
        try:
            group.stop()
        finally:
            del os.environ[SHARED_DIR_ENV]
            shutil.rmtree(metrics_dir, ignore_errors=True)


class _Group:
    def __init__(self, config: Config, sockets: Sockets) -> None:
        self.config = config
        self.sockets = sockets
        base = config.cluster.node_id
        self.workers = [_Worker(i, f"{base}-w{i}") for i in range(config.server.workers)]

    # -- the group's life ----------------------------------------------------------------

    def run(self, *, demo: bool, announce: Announce) -> None:
        first, *rest = self.workers
        self._start(first, demo=demo, take_over=False)
        if not self._wait_ready([first]):
            return
        for worker in rest:
            self._start(worker, demo=False, take_over=False)
        if not self._wait_ready(rest):
            return
        info = first.ready or {}
        announce(str(info["url"]), str(info["database"]), info.get("token"))
        log.info(
            "%d workers ready", len(self.workers), extra=event("workers", count=len(self.workers))
        )
        while not self._signalled(TICK_S):
            self._read_ready()
            for worker in self._reap():
                self._ended(worker)
            now = time.monotonic()
            for worker in self.workers:
                if worker.restart_at is not None and now >= worker.restart_at:
                    self._start(worker, demo=False, take_over=True)

    def _wait_ready(self, workers: list[_Worker]) -> bool:
        """Until every one of ``workers`` reported ready; False when a stop signal came
        first (the caller stops the group), :class:`WorkersError` when one ended first."""
        while any(worker.ready is None for worker in workers):
            if self._signalled(0):
                return False
            self._read_ready(TICK_S)
            for worker in self._reap():
                if worker in workers and worker.ready is None:
                    raise WorkersError(
                        f"worker {worker.node_id} could not start (its error is logged above)"
                    )
                self._ended(worker)
        return True

    def _signalled(self, timeout: float) -> bool:
        """Whether SIGTERM or SIGINT came within ``timeout`` seconds (SIGCHLD just wakes)."""
        got = signal.sigtimedwait(_SIGNALS, timeout)
        if got is None or got.si_signo == signal.SIGCHLD:
            return False
        name = signal.Signals(got.si_signo).name
        log.info("received %s, stopping the workers", name, extra=event("signal", signal=name))
        return True

    def stop(self) -> None:
        """SIGTERM to every worker; wait for them (bounded), kill what still runs."""
        running = [worker for worker in self.workers if worker.pid]
        for worker in running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGTERM)
        server = self.config.server
        deadline = time.monotonic() + server.drain_s + server.shutdown_grace_s + STOP_MARGIN_S
        while any(worker.pid for worker in self.workers) and time.monotonic() < deadline:
            self._reap()
            signal.sigtimedwait(_SIGNALS, TICK_S)  # a second stop signal changes nothing
        for worker in self.workers:
            if worker.pid:
                log.error("worker %s did not stop in time: killed", worker.node_id)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.pid, signal.SIGKILL)
                os.waitpid(worker.pid, 0)
                worker.pid = 0
            self._close_ready(worker)

    # -- one worker ----------------------------------------------------------------------

    def _start(self, worker: _Worker, *, demo: bool, take_over: bool) -> None:
        read_fd, write_fd = os.pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the worker: never back into the parent's code
            try:
                os.close(read_fd)
                _end_with_parent(parent)
                _worker_main(self.config, self.sockets, worker.node_id, write_fd, demo, take_over)
            finally:
                os._exit(1)
        os.close(write_fd)
        worker.pid, worker.ready_fd, worker.buffer, worker.ready = pid, read_fd, b"", None
        worker.started_at, worker.restart_at = time.monotonic(), None
        log.info(
            "worker %s started (pid %d)",
            worker.node_id,
            pid,
            extra=event("worker_started", node_id=worker.node_id, pid=pid),
        )

    def _ended(self, worker: _Worker) -> None:
        """A worker ended while the group serves: schedule its restart."""
        quick = time.monotonic() - worker.started_at < STABLE_S
        worker.failures = worker.failures + 1 if quick else 1
        backoff = min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** (worker.failures - 1))
        worker.restart_at = time.monotonic() + backoff
        log.warning(
            "worker %s ended: restarting it in %.1f s",
            worker.node_id,
            backoff,
            extra=event("worker_ended", node_id=worker.node_id, restart_in_s=backoff),
        )

    def _reap(self) -> list[_Worker]:
        """The workers that ended since the last look (their pids cleared)."""
        ended = []
        for worker in self.workers:
            if not worker.pid:
                continue
            pid, status = os.waitpid(worker.pid, os.WNOHANG)
            if pid == 0:
                continue
            forget_worker(pid)
            worker.pid = 0
            self._close_ready(worker)
            code = os.waitstatus_to_exitcode(status)
            how = f"signal {signal.Signals(-code).name}" if code < 0 else f"status {code}"
            log.info("worker %s exited (%s)", worker.node_id, how)
            ended.append(worker)
        return ended

    def _read_ready(self, timeout: float = 0.0) -> None:
        fds = {w.ready_fd: w for w in self.workers if w.ready_fd >= 0}
        if not fds:
            if timeout:
                signal.sigtimedwait({signal.SIGCHLD}, timeout)
            return
        readable, _, _ = select.select(list(fds), [], [], timeout)
        for fd in readable:
            worker = fds[fd]
            chunk = os.read(fd, 65536)
            worker.buffer += chunk
            if not chunk or b"\n" in worker.buffer:
                line = worker.buffer.split(b"\n", 1)[0]
                if line:
                    worker.ready = orjson.loads(line)
                self._close_ready(worker)

    @staticmethod
    def _close_ready(worker: _Worker) -> None:
        if worker.ready_fd >= 0:
            os.close(worker.ready_fd)
            worker.ready_fd = -1


def _worker_main(
    config: Config,
    sockets: Sockets,
    node_id: str,
    ready_fd: int,
    demo: bool,
    take_over: bool,
) -> NoReturn:
    """A forked worker: serve until SIGTERM, then end the process (never returning into
    the parent's code)."""
    status = 1
    try:
        os.setpgid(0, 0)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        config = replace(config, cluster=replace(config.cluster, node_id=node_id))
        runtime = Runtime.open(config, take_over=take_over)
        runtime.demo = demo

        async def run() -> None:
            async with trio.open_nursery() as nursery:
                binds = await nursery.start(
                    partial(serve, runtime, sockets, accept_when_ready=True)
                )
                settle_heap()
                ready = {"url": binds[0], "database": runtime.store.name}
                ready["token"] = runtime.demo_token
                os.write(ready_fd, orjson.dumps(ready) + b"\n")
                os.close(ready_fd)

        try:
            trio.run(run)
        finally:
            runtime.store.close()
        status = 0
    except StoreError as exc:
        log.error("worker %s: %s", node_id, exc)
    except BaseException:
        log.exception("worker %s failed", node_id)
    finally:
        logging.shutdown()
        os._exit(status)  # never the parent's exit handlers nor its buffered stdout


def _end_with_parent(parent: int) -> None:
    """On Linux, SIGTERM to this (forked) worker when its parent dies (else nothing)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the call took effect
        os.kill(os.getpid(), signal.SIGTERM)
