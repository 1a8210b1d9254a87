"""The response cache: a step of the walk between resolving a call (6) and reserving (8).

    prepare()  6 resolve ──► look()  hit ──────────────► answer_hit(), replay_hit(): the
                                │                         stored answer (a stream replays
                                │                         its chunks), its own record,
                                │                         settled 0
                                ├─ miss, the key claimed ──► 8 reserve, 9 call … 10 settle
                                │                         └─► Ticket.settled(): stored
                                │                             (ok) or the claim dropped
                                ├─ claimed by another call: wait (an event in this process,
                                │  the claim row polled across workers and nodes), then a hit,
                                │  or a miss of its own when the first failed
                                └─ bypass (off, zero_retention, not deterministic,
                                   ``Cache-Control: no-store``, the store unreachable)

The key (:func:`cache_key`): the organisation (and the key with ``scope = "key"``), the
endpoint, the resolved model, the effective output ceiling and every field of the body
but those that cannot change the answer (:data:`NOT_KEYED`), canonicalised by orjson
with sorted keys. A stream and a call without one share an entry: the answer is stored
as the chat chunks or the completion it came as, and rendered in either form
(:mod:`.chunking`).

Money: a hit reserves nothing and settles 0; its record names the original request and
what it saved (the original's settled cost). Only an answer that completed is stored
(a length-truncated one is); a failure, a cut stream, a client that left store nothing.

Modules: :mod:`.lookup` (the key, the claim, this process's flights, the sweep),
:mod:`.answers` (what a miss keeps, how a hit is answered and recorded),
:mod:`.recording` (a streamed miss's items), :mod:`.chunking` (a chat answer in the other form).
"""

from gateway.calls.cache.answers import answer_hit, is_hit, keep, recording, replay_hit
from gateway.calls.cache.lookup import BYPASS, HIT, MISS, ResponseCache, Ticket, cache_key

__all__ = [
    "BYPASS",
    "HIT",
    "MISS",
    "ResponseCache",
    "Ticket",
    "answer_hit",
    "cache_key",
    "is_hit",
    "keep",
    "recording",
    "replay_hit",
]
