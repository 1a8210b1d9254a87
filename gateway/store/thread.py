"""A long-lived thread per database connection, reached from trio without a thread pool.

``trio.to_thread.run_sync`` copies the context, takes a limiter, finds a thread in its
cache and renames it (two ``prctl`` calls) on every hop; for the store's writer, which
hops once per batch, that was the serving thread's largest single cost (bench/RESULTS.md,
"The hot path"). A :class:`ConnThread` keeps one thread for one connection, so while
serving the connection is used by that thread alone and its calls run one at a time, in
order; a hop is a queue put, the thread's run, and one ``run_sync_soon`` back.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from contextlib import suppress
from typing import Any, TypeVar, cast

import outcome
import trio

T = TypeVar("T")


class _Job:
    __slots__ = ("abandoned", "args", "fn", "task", "token")

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        task: trio.lowlevel.Task,
        token: trio.lowlevel.TrioToken,
    ) -> None:
        self.fn, self.args, self.task, self.token = fn, args, task, token
        self.abandoned = False


class ConnThread:
    """One daemon thread that runs the blocking calls given to :meth:`run`, in order."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    async def run(
        self,
        fn: Callable[..., T],
        *args: Any,
        abandon_on_cancel: bool = False,
        shielded: bool = False,
    ) -> T:
        """``fn(*args)`` on the thread; its result or exception.

        Cancelled while the call runs: the caller waits for it to end (the default, as
        ``trio.to_thread.run_sync``), or with ``abandon_on_cancel`` returns at once and
        the result is dropped (the call still runs to its end on the thread).
        ``shielded``: run even when the caller is cancelled already (as under a
        shielded scope, without the scope's cost); the cancellation comes after.
        """
        if not shielded:
            await trio.lowlevel.checkpoint_if_cancelled()
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
            self._thread.start()
        job = _Job(fn, args, trio.lowlevel.current_task(), trio.lowlevel.current_trio_token())
        self._jobs.put(job)

        def abort(_: Any) -> trio.lowlevel.Abort:
            if not abandon_on_cancel:
                return trio.lowlevel.Abort.FAILED
            job.abandoned = True
            return trio.lowlevel.Abort.SUCCEEDED

        # the thread's outcome is the task's: a value returned, an exception raised
        return cast(T, await trio.lowlevel.wait_task_rescheduled(abort))

    def stop(self) -> None:
        """End the thread once the calls queued before are done."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread = None

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            result = outcome.capture(job.fn, *job.args)
            with suppress(trio.RunFinishedError):
                job.token.run_sync_soon(_deliver, job, result)


def _deliver(job: _Job, result: outcome.Outcome[Any]) -> None:
    if not job.abandoned:
        trio.lowlevel.reschedule(job.task, result)
