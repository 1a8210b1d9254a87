"""The calls in flight in this process, and the end of a graceful stop.

On SIGTERM or SIGINT the server stops accepting and lets the calls in progress finish
within ``[server] shutdown_grace_s``. At that deadline :meth:`InFlight.cut` cuts every
call still running: its provider call is cancelled and it ends as
``service_unavailable`` (a non-streamed call answered 503, an open stream with an
in-band error event), settled by the settlement table like any other ending. The server
then waits (:meth:`InFlight.wait_settled`) until every call is settled, so that no
request row stays ``pending`` after a graceful stop.
"""

from __future__ import annotations

from typing import Protocol

import trio

#: what a call cut by a graceful stop answers
STOPPING_MESSAGE = "The server is shutting down; retry the call."


class Cuttable(Protocol):
    """A call in flight, as a graceful stop sees it (:class:`gateway.calls.lifecycle.Call`)."""

    def cut(self) -> None: ...


class InFlight:
    """Every call from step 3 until :meth:`gateway.calls.lifecycle.Call.finish` settled it."""

    def __init__(self) -> None:
        self._calls: set[Cuttable] = set()
        self._settled = trio.Event()
        #: the grace has run out: every call, even one admitted from now on, is cut
        self.cutting = False

    def __len__(self) -> int:
        return len(self._calls)

    def add(self, call: Cuttable) -> None:
        self._calls.add(call)
        if self.cutting:
            call.cut()

    def discard(self, call: Cuttable) -> None:
        self._calls.discard(call)
        if not self._calls:
            self._settled.set()

    def cut(self) -> None:
        """The grace has run out: cut every call in flight."""
        self.cutting = True
        for call in list(self._calls):
            call.cut()

    async def wait_settled(self) -> None:
        """Return once no call is in flight."""
        while self._calls:
            self._settled = trio.Event()
            await self._settled.wait()
