"""Waiting on a condition, bounded: the one poll loop of the tests.

A test waits for an event where the code under test offers one (``trio.Event``,
:meth:`FakeUpstream.wait_until`, a process's exit). Where the condition lives in another
process or behind HTTP (a row of the database, a node's answer, a log line), it is
polled here: every ``every`` seconds, failing with :class:`trio.TooSlowError` past
``within``. Nothing in the tests waits a fixed time.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import TypeVar, cast

import trio

T = TypeVar("T")


async def until(check: Callable[[], T | Awaitable[T]], *, within: float, every: float = 0.05) -> T:
    """The first truthy value ``check()`` gives (awaited if it is awaitable), asked every
    ``every`` seconds; :class:`trio.TooSlowError` if none came within ``within`` seconds."""
    with trio.fail_after(within):
        while True:
            result = check()
            value = await result if inspect.isawaitable(result) else result
            if value:
                return cast(T, value)
            await trio.sleep(every)
