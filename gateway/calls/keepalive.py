"""When a stream's body has waited a keep-alive interval for its pump: one clock task for
every stream instead of a cancel scope for every wait.

A stream's body waits for its pump's frames between two upstream reads, so for each
relayed batch (at a model's pace, a chunk or two). Under a cancel scope with the
keep-alive timeout, each wait cost about fifty function calls: a fifth of the work of a
paced chunk (bench/RESULTS.md, "Workers (issue 34)" h). Instead a waiting body notes the
clock's tick and parks; one task ticks every ``interval / TICKS`` and wakes each body
that has waited ``TICKS - 1`` whole ticks, so a keep-alive follows between 0.75 and 1
interval of silence (never later than the interval). While the task does not run (a
call served outside :func:`gateway.serving.server.serve`), a body waits under a scope as
before. The shards' watchdog bounds their replies the same way (``shards/actor.py``).
"""

from __future__ import annotations

from typing import Protocol

import trio


class Sleeper(Protocol):
    """A body parked until its next frame: :meth:`keepalive_due` wakes it for a keep-alive."""

    #: the clock's tick when it parked
    since: int

    def keepalive_due(self) -> None: ...


class KeepaliveClock:
    TICKS = 4

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.tick = 0
        self.running = False
        #: the bodies parked now
        self.parked: set[Sleeper] = set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.running = True
        task_status.started()
        try:
            while True:
                await trio.sleep(self.interval_s / self.TICKS)
                self.tick += 1
                oldest = self.tick - self.TICKS
                for sleeper in [s for s in self.parked if s.since <= oldest]:
                    self.parked.discard(sleeper)
                    sleeper.keepalive_due()
        finally:
            # the bodies still parked wait under their own scope from their next wait on
            self.running = False
            for sleeper in list(self.parked):
                sleeper.keepalive_due()
            self.parked.clear()
