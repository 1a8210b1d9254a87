"""Key shards: the actors that own all per-key admission state of svc-gateway.

A pure actor library (stdlib + trio; it imports nothing from ``gateway``). A
request handler talks to it in three steps of the request walk::

    pool = ShardPool(n_shards=16)
    await nursery.start(pool.run)
    ref = pool.key_ref(key_id, family_id)    # once per key, kept with the key
    key = {"shard": ref.shard, "key": ref.state}

    adm = await pool.admit(AdmitRequest.build(**key, ...))      # 3: rpm, slot
    res = await pool.reserve(ReserveRequest.build(**key, ...))  # 8: tpm, caps, credits
    ...                                                         # 9: call the provider
    await pool.settle(SettleRequest.build(**key, ...))          # 10: post or void

Where to read next: :mod:`shards.pool` (routing, supervision, the API),
:mod:`shards.actor` (mailbox, one-shot replies, abandonment),
:mod:`shards.state` (admission and settlement rules), :mod:`shards.keys` (a key's
windows), :mod:`shards.org` (organisation accounts and the atomicity invariant),
:mod:`shards.windows` (clock minute, UTC day and month), :mod:`shards.messages`
(the vocabulary).

Money is integer nano-USD (:data:`NANOS_PER_USD`), tokens are ints, ``None``
limits mean unlimited.
"""

from . import messages
from .actor import ShardUnavailable
from .clock import Clock, FakeClock, NonDecreasingClock, SystemClock
from .keys import KeyRef, KeyState
from .leases import LeaseBook, LeaseNeed, LeaseShort, lease_size, posted
from .messages import *  # noqa: F403 -- the whole vocabulary, as messages.__all__ names it
from .org import OrgSnapshot
from .pool import PoolStatistics, ShardPool, shard_index
from .windows import (
    day_resets_at,
    day_window,
    minute_resets_at,
    minute_window,
    month_resets_at,
    month_window,
    seconds_until_minute_reset,
)

__all__ = [
    "Clock",
    "FakeClock",
    "KeyRef",
    "KeyState",
    "LeaseBook",
    "LeaseNeed",
    "LeaseShort",
    "NonDecreasingClock",
    "OrgSnapshot",
    "PoolStatistics",
    "ShardPool",
    "ShardUnavailable",
    "SystemClock",
    "day_resets_at",
    "day_window",
    "lease_size",
    "minute_resets_at",
    "minute_window",
    "month_resets_at",
    "month_window",
    "posted",
    "seconds_until_minute_reset",
    "shard_index",
]
__all__ += messages.__all__
