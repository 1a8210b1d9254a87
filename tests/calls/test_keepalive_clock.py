"""The keep-alive clock (gateway/calls/keepalive.py) on virtual time: a parked body is
woken after 0.75 to 1 interval, never later; one that left is not woken."""

from __future__ import annotations

import trio
import trio.testing

from gateway.calls.keepalive import KeepaliveClock

INTERVAL_S = 1.0


class Body:
    def __init__(self, clock: KeepaliveClock) -> None:
        self.since = clock.tick
        self.woken_at: float | None = None
        self.woken = trio.Event()
        clock.parked.add(self)

    def keepalive_due(self) -> None:
        self.woken_at = trio.current_time()
        self.woken.set()


async def test_a_parked_body_is_woken_within_one_interval(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clock = KeepaliveClock(INTERVAL_S)
    async with trio.open_nursery() as nursery:
        await nursery.start(clock.run)
        assert clock.running
        for offset in (0.0, 0.1, 0.24, 0.26, 0.6):
            await trio.sleep(offset)  # virtual time: parked anywhere within a tick
            parked_at = trio.current_time()
            body = Body(clock)
            await body.woken.wait()
            assert body.woken_at is not None
            waited = body.woken_at - parked_at
            assert 0.75 * INTERVAL_S - 1e-9 <= waited <= INTERVAL_S + 1e-9, (offset, waited)
            assert body not in clock.parked
        nursery.cancel_scope.cancel()
    assert not clock.running


async def test_a_body_that_left_is_not_woken_and_the_rest_are_at_the_end(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clock = KeepaliveClock(INTERVAL_S)
    async with trio.open_nursery() as nursery:
        await nursery.start(clock.run)
        left, stays = Body(clock), Body(clock)
        clock.parked.discard(left)  # its frame came first
        await stays.woken.wait()
        assert not left.woken.is_set()
        last = Body(clock)  # parked: the clock stops before its interval
        nursery.cancel_scope.cancel()
    # the clock stopped: a body still parked is woken (it waits under a scope from then on)
    assert last.woken.is_set() and not clock.parked
