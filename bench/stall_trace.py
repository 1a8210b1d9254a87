"""What may stall a serving process, logged with its instants (``bench/workers.py --trace``).

Installed in the gateway's process by a ``sitecustomize.py`` that ``bench/workers.py``
writes beside the events file (``BENCH_STALL_TRACE``: the file), before ``gateway``
is imported. It logs, one JSON line each (``pid``, ``what``, wall-clock ``start``, ``ms``):

- each run of the cyclic collector (``gc gen<N>``, its collected count);
- each batch the store commits (``commit <ops>``: the whole batch on the writer's thread,
  where SQLite's automatic WAL checkpoint runs inside the COMMIT that crosses its size);
- each step of a trio task longer than ``STEP_MS`` (``step <task>``): the serving thread
  busy with one task, every other waiting.

Bench only: nothing of this is in the gateway.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from typing import Any

import orjson

STEP_MS = 1.0


class _Log:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def __call__(self, what: str, start: float, ms: float) -> None:
        line = {"pid": os.getpid(), "what": what, "start": start, "ms": ms}
        os.write(self.fd, orjson.dumps(line) + b"\n")


def install(path: str) -> None:
    log = _Log(path)
    local = threading.local()

    def collector(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            local.gc = (time.time(), time.perf_counter())
        elif hasattr(local, "gc"):
            wall, began = local.gc
            ms = (time.perf_counter() - began) * 1000
            log(f"gc gen{info['generation']} collected={info['collected']}", wall, ms)

    gc.callbacks.append(collector)

    from gateway.store import Store

    commit = Store._commit

    def timed_commit(self: Store, batch: list[Any]) -> Any:
        wall, began = time.time(), time.perf_counter()
        try:
            return commit(self, batch)
        finally:
            log(f"commit ops={len(batch)}", wall, (time.perf_counter() - began) * 1000)

    Store._commit = timed_commit  # type: ignore[method-assign]  # the bench's probe

    import trio

    class Steps(trio.abc.Instrument):
        def __init__(self) -> None:
            self.began = 0.0

        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            self.began = time.perf_counter()

        def after_task_step(self, task: trio.lowlevel.Task) -> None:
            ms = (time.perf_counter() - self.began) * 1000
            if ms > STEP_MS:
                log(f"step {task.name}", time.time() - ms / 1000, ms)

    run = trio.run

    def instrumented(*args: Any, **kwargs: Any) -> Any:
        kwargs["instruments"] = [*kwargs.get("instruments", ()), Steps()]
        return run(*args, **kwargs)

    trio.run = instrumented


SITECUSTOMIZE = """
import os
if os.environ.get("BENCH_STALL_TRACE"):
    from bench.stall_trace import install
    install(os.environ["BENCH_STALL_TRACE"])
"""
