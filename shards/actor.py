"""One shard actor: a bounded mailbox, a run loop, and one-shot replies.

The round trip of a call (handler side → actor → handler side)
----------------------------------------------------------------
1. The caller wraps its frozen message in a :class:`ReplySlot` (a one-shot reply:
   a handful of slots, no channel or Event per call) and puts it in the shard's
   bounded ``trio.open_memory_channel(queue_size)``: ``send_nowait`` when there
   is room, else ``await send`` under a deadline of ``reply_timeout_s``
   (back-pressure; a send that times out never enqueued anything).
2. The caller parks on the slot (``wait_task_rescheduled``). The wait is bounded
   by the pool's :class:`Watchdog` (``reply_timeout_s`` to 1.25 × that), which
   costs a set insertion instead of a trio cancel scope per call.
3. The actor takes slots in order with ``receive_nowait`` while its ``queued``
   count is positive, and otherwise sleeps until a sender wakes it (below). A slot
   whose caller gave up is skipped. Else it
   runs the synchronous handler for the message type (:class:`~shards.state.
   ShardState`), stores the result (or the exception) in the slot and wakes the
   caller.
4. The caller returns the result, or raises :class:`ShardUnavailable` when the
   deadline passed, the shard is closed, or the handler failed.

Why no effect is left behind for a caller that gave up: trio runs one task at a
time. A parked caller is woken exactly once, by whoever comes first: the actor's
reply, the watchdog, or trio's abort callback when the caller is cancelled. The
watchdog and the abort callback mark the slot ``abandoned``, and they can only run
while the actor has not replied, i.e. has not applied the message; the actor checks
the flag before applying. If the actor answered first, the call returns normally
and the caller owns the effect (a slot, a reservation).

Why the actor sleeps on its own wake-up rather than in the channel's ``receive()``:
an idle actor woken per message (a lone caller's every round trip) paid for the
channel's receive bookkeeping, two ``WouldBlock`` exceptions and a ``Value`` per
wake, about 2.5 µs of a 12 µs round trip. The mailbox is still the bounded memory
channel (its order, its back-pressure on senders); only the sleep is the shard's.
``queued`` counts the messages sent (counted by the sender once its send returned)
minus those taken, so it never exceeds what the buffer holds; a sender that counts
a message wakes the actor if it sleeps. So the actor never sleeps on a message
whose sender has counted it, and a message not yet counted has a sender about to.

Settlements are must-deliver: queued even if the caller is being cancelled, and
never marked abandoned. The wait for the reply refuses cancellation (the abort
callback answers ``Abort.FAILED``; the cancellation is delivered at the caller's
next checkpoint), so when ``settle`` returns the settlement has been applied. If
the reply is late the caller gets :class:`ShardUnavailable`, yet the settlement
stays queued and will be applied.

Supervision: an exception raised while handling one message is logged on logger
``"shards"`` and sent back to that caller (who raises ``ShardUnavailable``); the
actor keeps serving. An exception in the loop itself propagates out of
:meth:`Shard.run` and tears down the pool's nursery: the process fails loudly
instead of answering from a dead actor.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Callable, Generator
from typing import Any

import trio
from outcome import Outcome
from trio.lowlevel import Abort, Task, current_task, reschedule, wait_task_rescheduled

from .messages import (
    AdmitRequest,
    KeyStatusRequest,
    Message,
    ReserveRequest,
    SettleRequest,
)
from .state import ShardState

__all__ = ["ReplySlot", "Shard", "ShardUnavailable"]

logger = logging.getLogger("shards")

#: messages handled in a row before the actor yields to other tasks
_BATCH = 128


class ShardUnavailable(Exception):
    """A shard could not answer in time (or failed): answer 503 admission_unavailable.

    Nothing was applied for the call, except for a late settlement, which stays
    queued and is applied later.
    """


class ReplySlot(Outcome[None]):
    """A one-shot reply between one caller and the actor (single-threaded, no locks).

    ``waiting`` is True exactly while the caller is parked in
    ``wait_task_rescheduled`` on this slot; whoever wakes it (the actor's
    :meth:`reply`, the :class:`Watchdog`'s :meth:`expire`, or trio's abort
    callback) clears it first, so the caller is woken exactly once.

    The slot is also the :class:`outcome.Outcome` trio hands back to the woken
    caller (``reschedule(task, slot)``): its :meth:`unwrap` gives ``None`` and the
    answer stays in the slot. That spares a ``Value`` object per reply, which
    costs about 1 µs to build and unwrap here, a tenth of a round trip.
    """

    __slots__ = (
        "abandoned",
        "born",
        "done",
        "error",
        "message",
        "must_deliver",
        "result",
        "task",
        "waiting",
    )

    # Outcome's attrs-made ``__eq__`` would make slots unhashable (the watchdog
    # keeps them in a set): a slot is only ever equal to itself.
    __eq__ = object.__eq__
    __hash__ = object.__hash__  # type: ignore[assignment]  # Outcome (attrs, eq) sets None

    #: the parked caller: set before it parks, read only while ``waiting``
    task: Task

    def __init__(self, message: Message, must_deliver: bool = False) -> None:
        self.message = message
        self.must_deliver = must_deliver
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = False
        self.waiting = False
        self.abandoned = False
        self.born = 0

    def reply(self, result: Any, error: BaseException | None) -> None:
        """Actor side: store the answer and wake the caller if it waits."""
        self.result = result
        self.error = error
        self.done = True
        if self.waiting:
            self.waiting = False
            reschedule(self.task, self)

    def expire(self) -> None:
        """Watchdog side: the deadline passed; wake the caller without an answer."""
        if self.waiting:
            self.waiting = False
            if not self.must_deliver:
                self.abandoned = True
            reschedule(self.task)

    # -- outcome.Outcome: what wait_task_rescheduled returns to the woken caller --

    def unwrap(self) -> None:
        """The caller reads the answer from the slot, see :meth:`outcome`."""

    def send(self, gen: Generator[Any, None, object]) -> Any:
        return gen.send(None)

    async def asend(self, agen: AsyncGenerator[Any, None]) -> Any:
        return await agen.asend(None)

    def abort_abandon(self, _raise_cancel: object) -> Abort:
        """Cancelled before the actor replied: the actor must never apply it."""
        self.waiting = False
        self.abandoned = True
        return Abort.SUCCEEDED

    def abort_keep(self, _raise_cancel: object) -> Abort:
        """Stop waiting, but the (must-deliver) message stays queued."""
        self.waiting = False
        return Abort.SUCCEEDED

    def abort_refuse(self, _raise_cancel: object) -> Abort:
        """Shield a must-deliver wait: keep waiting for the reply or the watchdog."""
        return Abort.FAILED

    def outcome(self) -> Any:
        """The caller's view once the wait is over: the result, or raise."""
        if not self.done:
            raise ShardUnavailable("shard did not answer in time")
        if self.error is not None:
            raise ShardUnavailable(f"shard failed: {self.error!r}") from self.error
        return self.result


class Watchdog:
    """Bounds every wait for a reply, without a cancel scope per call.

    A trio cancel scope costs several microseconds to enter and leave, more than
    the rest of a round trip. Instead, a parked caller registers its slot here with
    the current tick; one task ticks every ``timeout / 4`` and wakes every slot that
    has waited more than ``timeout`` (so a wait lasts at most 1.25 × ``timeout``).
    While the watchdog is not running (before :meth:`ShardPool.run`), callers fall
    back to a real cancel scope.
    """

    _TICKS = 4

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.period_s = timeout_s / self._TICKS
        self.tick = 0
        self.parked: set[ReplySlot] = set()
        self.running = False
        self.expired = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.running = True
        task_status.started()
        try:
            while True:
                await trio.sleep(self.period_s)
                self.tick += 1
                oldest = self.tick - self._TICKS - 1
                late = [slot for slot in self.parked if slot.born <= oldest]
                for slot in late:
                    self.parked.discard(slot)
                    self.expired += 1
                    slot.expire()
        finally:
            self.running = False
            for slot in list(self.parked):
                slot.expire()
            self.parked.clear()


class Shard:
    """One actor task, its mailbox, and the state it alone mutates."""

    def __init__(
        self,
        index: int,
        state: ShardState,
        queue_size: int,
        watchdog: Watchdog,
    ) -> None:
        self.index = index
        self.state = state
        self.watchdog = watchdog
        self.send_channel, self.receive_channel = trio.open_memory_channel[ReplySlot](queue_size)
        #: messages sent (and counted by their sender) minus messages taken: never
        #: more than the buffer holds (see the module docstring)
        self.queued = 0
        #: the actor task while it sleeps on an empty mailbox; a sender wakes it
        self._idle: Task | None = None
        self.handled = 0
        self.failed = 0
        self.skipped = 0
        self.running = False
        self._handlers: dict[type, Callable[[Any], Any]] = {
            AdmitRequest: state.admit,
            ReserveRequest: state.reserve,
            SettleRequest: state.settle,
            KeyStatusRequest: state.status,
        }

    # -- caller side --------------------------------------------------------------

    async def call(self, message: Message) -> Any:
        """Send ``message``, await the reply; ``ShardUnavailable`` on timeout.

        If the caller is cancelled before the reply, the message is abandoned
        (never applied) and the cancellation propagates.
        """
        slot = ReplySlot(message)
        try:
            self.send_channel.send_nowait(slot)
        except trio.WouldBlock:
            with trio.move_on_after(self.watchdog.timeout_s) as scope:
                await self.send_channel.send(slot)
            if scope.cancelled_caught:  # cancelled sends never enqueue
                raise ShardUnavailable(f"shard {self.index} mailbox full") from None
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise ShardUnavailable(f"shard {self.index} is closed") from exc
        self._queued(slot)
        if not slot.done:
            await self._wait(slot, slot.abort_abandon, shield=False)
        return slot.outcome()

    async def call_must_deliver(self, message: Message) -> Any:
        """Like :meth:`call`, but queued even under cancellation and never dropped.

        The wait for the reply is shielded too (bounded by the timeout), so that
        when this returns normally the settlement has been applied.
        """
        slot = ReplySlot(message, must_deliver=True)
        try:
            self.send_channel.send_nowait(slot)
        except trio.WouldBlock:
            with trio.CancelScope(shield=True):
                await self.send_channel.send(slot)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise ShardUnavailable(f"shard {self.index} is closed") from exc
        self._queued(slot)
        if not slot.done:
            await self._wait(slot, slot.abort_refuse, shield=True)
        if not slot.done:
            logger.warning("shard %d: settlement queued but not confirmed in time", self.index)
        return slot.outcome()

    def _queued(self, slot: ReplySlot) -> None:
        """Count a sent slot, and wake the actor if it sleeps on an empty mailbox."""
        self.queued += 1
        if (idle := self._idle) is not None:
            self._idle = None
            reschedule(idle, slot)  # the slot doubles as the wake-up's outcome

    async def _wait(
        self, slot: ReplySlot, abort: Callable[[object], Abort], *, shield: bool
    ) -> None:
        """Park until the actor replies or the watchdog expires the slot.

        ``abort`` decides what a cancellation does to the parked wait (abandon the
        message, or refuse and keep waiting). Before the watchdog runs, a real cancel
        scope bounds the wait; a shielded one keeps the message queued on cancellation.
        """
        watchdog = self.watchdog
        slot.task = current_task()
        slot.waiting = True
        if watchdog.running:
            slot.born = watchdog.tick
            watchdog.parked.add(slot)
            try:
                await wait_task_rescheduled(abort)
            finally:
                watchdog.parked.discard(slot)
        else:
            with trio.CancelScope(deadline=trio.current_time() + watchdog.timeout_s) as scope:
                scope.shield = shield
                await wait_task_rescheduled(slot.abort_keep if shield else slot.abort_abandon)

    # -- actor side ---------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The actor loop: take slots in order, apply, reply. Runs until cancelled."""
        if self.running:
            raise RuntimeError(f"shard {self.index} is already running")
        self.running = True
        receive = self.receive_channel
        handlers = self._handlers
        task_status.started()
        try:
            in_a_row = 0
            while True:
                if self.queued <= 0:
                    # Nothing counted: sleep until a sender counts a message and wakes
                    # this task (see the class docstring).
                    in_a_row = 0
                    self._idle = current_task()
                    await wait_task_rescheduled(self._abort_idle)
                    continue
                slot = receive.receive_nowait()
                self.queued -= 1
                if slot.abandoned:
                    self.skipped += 1
                    continue
                message = slot.message
                try:
                    result = handlers[type(message)](message)
                except Exception as exc:
                    self.failed += 1
                    logger.exception(
                        "shard %d failed handling %s", self.index, type(message).__name__
                    )
                    slot.reply(None, exc)
                else:
                    self.handled += 1
                    slot.reply(result, None)
                # Draining a full mailbox never yields on its own: let others run.
                in_a_row += 1
                if in_a_row >= _BATCH:
                    in_a_row = 0
                    await trio.lowlevel.checkpoint()
        except trio.EndOfChannel:
            return
        finally:
            self.running = False
            self._fail_queued()

    def _abort_idle(self, _raise_cancel: object) -> Abort:
        """The actor is cancelled in its sleep: nobody is to wake it any more."""
        self._idle = None
        return Abort.SUCCEEDED

    def _fail_queued(self) -> None:
        """On shutdown, answer every queued caller instead of leaving it to time out."""
        while True:
            try:
                slot = self.receive_channel.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return
            self.queued -= 1
            if not slot.abandoned:
                if slot.must_deliver:
                    logger.error("shard %d stopped with a settlement queued", self.index)
                slot.reply(None, ShardUnavailable("shard stopped"))

    def queue_length(self) -> int:
        return self.send_channel.statistics().current_buffer_used
