"""The lifecycle of one server, and what readiness says about it.

    STARTING ──(start-up work done)──► READY ──(stop signal)──► STOPPING

- **STARTING**: hypercorn already answers, so that a load balancer sees the process;
  /healthz says ok, /readyz says ``starting``, every other path answers 503
  ``service_unavailable``. Not a worker of several (``serve --workers N``): it shares
  its socket with its siblings and accepts nothing until READY (:mod:`gateway.serving.workers`).
  The start-up work runs here, in order: :attr:`Readiness.startup`
  (today the rebuild of spend from the store, then the demo organisation on an empty
  database; crash recovery of pending reservations belongs there too, before any call).
- **READY**: everything is served; /readyz checks the store and the shards on each probe.
- **STOPPING**: from the stop signal on, /readyz says ``stopping``; for ``[server] drain_s``
  everything is still served so that a balancer can move away, then hypercorn stops
  accepting and lets the calls in progress finish.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

#: the bound on the store's answer to a readiness probe
STORE_TIMEOUT_S = 1.0


class Phase(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"


@dataclass
class Readiness:
    phase: Phase = Phase.STARTING
    #: the start-up work, run in order while the phase is STARTING
    startup: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    async def start_up(self) -> None:
        for step in self.startup:
            await step()

    def ready(self) -> None:
        """Every part runs: serve (unless a stop began meanwhile)."""
        if self.phase is Phase.STARTING:
            self.phase = Phase.READY


def unready_reason(
    phase: Phase,
    shards_running: bool,
    store_answers: bool,
    fenced: bool = False,
    settlements_queued: bool = False,
) -> str | None:
    """Why the server is not ready (None: it is). The phase comes first: while starting
    or stopping, the parts' state says nothing more. A node of several that could not
    renew its leases is ``fenced`` (it admits nothing). A settlement the store could not
    commit yet (it kept losing conflicts) is retried until it lands: until then the
    node's records are behind its memory, and it says so (``settlements_queued``)."""
    if phase is not Phase.READY:
        return str(phase.value)
    if not shards_running:
        return "shard_down"
    if not store_answers:
        return "store_unavailable"
    if fenced:
        return "fenced"
    if settlements_queued:
        return "settlements_queued"
    return None
