"""What a finished call counts against spend caps and what it bills: the spec's table.

    what happened                                         cap amount          billed
    ----------------------------------------------------  ------------------  ---------
    refused before the model was called                   0                   0
    provider refused before any work, nothing produced    0                   0
    provider reported usage                               real cost           real cost*
    5xx or lost connection, nothing produced, no usage    input share (>=1)   0
    anything else without usage (output streamed, our     full reservation    0
      own 504, another provider status, client gone,
      a graceful stop's cut; a crash, settled by start-up
      recovery in the store: records.recover_pending)
    a priced call answered (an MCP tools/call, its        its price           its price*
      isError result included: gateway/tools/)

    * live keys only: sandbox keys count against their caps at catalog prices and
      are never billed.

On embeddings every failure releases the reservation and counts nothing.
Amounts are nano-USD and never exceed what was reserved. Which row a call's ending is
decided in one place, :func:`ending_for`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from gateway.accounts.catalog import Model
from gateway.providers.base import Usage


class Ending(enum.Enum):
    NOT_CALLED = "not_called"
    PROVIDER_REFUSED = "provider_refused"
    USAGE = "usage"
    SERVER_ERROR = "server_error"  # 5xx or lost connection, nothing produced
    #: counts the full reservation: output already streamed, our own timeout, client
    #: gone, another provider status, a fault of ours after the call
    FULL_RESERVATION = "full_reservation"
    #: a call priced per call (a tool) that its server answered: the price, reserved whole
    PRICED_CALL = "priced_call"


@dataclass(frozen=True, slots=True)
class Settlement:
    ending: Ending
    cap_nanos: int
    billed_nanos: int


def ending_for(
    *,
    called: bool,
    answered: bool = False,
    usage: bool = False,
    failure: Ending | None = None,
    produced: bool = False,
    failures_count: bool = True,
) -> Ending:
    """The row of the table for a call that ended: the one place it is decided.

    ``called``: the provider was asked. ``answered``: it answered in full; otherwise the
    call failed, with the row of the provider's own failure in ``failure``
    (:mod:`gateway.calls.provider_errors`), or None when our deadline, the client or a fault
    of ours ended it. ``usage``: the provider reported usage. ``produced``: output was
    streamed. ``failures_count`` is False on embeddings, where every failure counts
    nothing.
    """
    if not called:
        return Ending.NOT_CALLED
    if not answered and not failures_count:
        return Ending.PROVIDER_REFUSED
    if usage:
        return Ending.USAGE
    if failure is None or produced:
        return Ending.FULL_RESERVATION
    return failure


def settle_amounts(
    ending: Ending,
    *,
    model: Model,
    reserved_nanos: int,
    prompt_estimate: int,
    usage: Usage | None = None,
    live: bool,
) -> Settlement:
    """The row of the table for ``ending``; ``usage`` is the reported usage, priced with
    its cached and cache-written tokens (:meth:`Model.cost_nanos`). The real cost is
    capped at the reservation: a cache-write price above the input price could otherwise
    take it past the worst case, which prices every input token as plain input."""
    if ending in (Ending.NOT_CALLED, Ending.PROVIDER_REFUSED):
        return Settlement(ending, 0, 0)
    if ending is Ending.USAGE:
        reported = usage or Usage(prompt_tokens=0)
        real = model.cost_nanos(
            reported.prompt_tokens,
            reported.completion_tokens,
            reported.cached_tokens,
            reported.cache_write_tokens,
        )
        cost = min(real, reserved_nanos)
        return Settlement(ending, cost, cost if live else 0)
    if ending is Ending.PRICED_CALL:
        return Settlement(ending, reserved_nanos, reserved_nanos if live else 0)
    if ending is Ending.SERVER_ERROR:
        share = min(model.cost_nanos(max(1, prompt_estimate), 0), reserved_nanos)
        return Settlement(ending, share, 0)
    return Settlement(ending, reserved_nanos, 0)
