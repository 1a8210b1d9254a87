"""What a finished call counts against spend caps and what it bills: the spec's table.

    what happened                                         cap amount          billed
    ----------------------------------------------------  ------------------  ---------
    refused before the model was called                   0                   0
    provider refused before any work, nothing produced    0                   0
    provider reported usage                               real cost           real cost*
    5xx or lost connection, nothing produced, no usage    input share (>=1)   0
    anything else without usage (output streamed, our     full reservation    0
      own 504, another provider status, client gone)

    * live keys only: sandbox keys count against their caps at catalog prices and
      are never billed.

On embeddings every failure releases the reservation and counts nothing.
Amounts are nano-USD and never exceed what was reserved.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from gateway.catalog import Model


class Ending(enum.Enum):
    NOT_CALLED = "not_called"
    PROVIDER_REFUSED = "provider_refused"
    USAGE = "usage"
    SERVER_ERROR = "server_error"  # 5xx or lost connection, nothing produced
    OTHER = "other"  # output already streamed, our own timeout, client gone, other status


@dataclass(frozen=True, slots=True)
class Settlement:
    ending: Ending
    cap_nanos: int
    billed_nanos: int


def settle_amounts(
    ending: Ending,
    *,
    model: Model,
    reserved_nanos: int,
    prompt_estimate: int,
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
    live: bool,
) -> Settlement:
    """The row of the table for ``ending``; ``*_tokens`` are the reported usage."""
    if ending in (Ending.NOT_CALLED, Ending.PROVIDER_REFUSED):
        return Settlement(ending, 0, 0)
    if ending is Ending.USAGE:
        cost = min(model.cost_nanos(prompt_tokens, completion_tokens), reserved_nanos)
        return Settlement(ending, cost, cost if live else 0)
    if ending is Ending.SERVER_ERROR:
        share = min(model.cost_nanos(max(1, prompt_estimate), 0), reserved_nanos)
        return Settlement(ending, share, 0)
    return Settlement(ending, reserved_nanos, 0)
