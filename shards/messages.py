"""The vocabulary between request handlers and shard actors.

Every request a handler sends and every answer a shard gives is a
:class:`typing.NamedTuple`: immutable once sent, so the actor and the caller share
no mutable state but the key's counters (below), and the cheapest immutable record
to build (a model call builds five of them; a frozen dataclass took twice as long,
a tenth of a round trip). Build them by keyword, so that a call site reads like the
spec's table of fields; fields with defaults come last, as tuples require.

A request names its key by the ``shard`` and ``state`` of its
:class:`~shards.keys.KeyRef` (resolved once by :meth:`~shards.pool.ShardPool.key_ref`),
never by a bare id: see that class for why. The state is the one mutable object a
message carries, as a handle: only the owning shard reads or writes it.

Money is integer nano-USD (``NANOS_PER_USD`` per dollar); tokens are ints; a limit of
``None`` means unlimited.

======================  ===========================  =================================
step of the request     request                      answer
======================  ===========================  =================================
3 admit                 :class:`AdmitRequest`        :class:`Admission`
8 reserve               :class:`ReserveRequest`      :class:`Reservation` or
                                                     :class:`ReserveRefusal`
10 settle               :class:`SettleRequest`       ``None``
GET /v1/key             :class:`KeyStatusRequest`    :class:`KeyStatus`
======================  ===========================  =================================
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final, Literal, NamedTuple, TypeVar

if TYPE_CHECKING:
    from .keys import KeyState

__all__ = [
    "BUDGET_EXCEEDED",
    "INSUFFICIENT_CREDITS",
    "KEY_CAP_EXCEEDED",
    "NANOS_PER_USD",
    "RATE_LIMITED",
    "TOO_MANY_IN_FLIGHT",
    "Admission",
    "AdmitRequest",
    "KeyStatus",
    "KeyStatusRequest",
    "Message",
    "Reservation",
    "ReserveRefusal",
    "ReserveRequest",
    "SettleRequest",
    "SpendWindow",
    "keyword_only",
]

NANOS_PER_USD: Final = 1_000_000_000

RATE_LIMITED: Final = "rate_limited"
TOO_MANY_IN_FLIGHT: Final = "too_many_in_flight"
KEY_CAP_EXCEEDED: Final = "key_cap_exceeded"
INSUFFICIENT_CREDITS: Final = "insufficient_credits"
BUDGET_EXCEEDED: Final = "budget_exceeded"

AdmitCode = Literal["rate_limited", "too_many_in_flight"]
ReserveCode = Literal["rate_limited", "key_cap_exceeded", "insufficient_credits", "budget_exceeded"]
#: Who refused: the key itself, its parent, the organisation, or the platform.
Scope = Literal["key", "parent", "org", "platform"]


_N = TypeVar("_N", bound=NamedTuple)
_T = TypeVar("_T")


class _Build:
    """The type checker's view of ``build``: the class it is read from, so a call is
    checked against the class's fields as ``cls(...)`` is. :func:`keyword_only`
    replaces it with the generated function."""

    def __get__(self, instance: object, owner: type[_T]) -> type[_T]:
        raise TypeError(f"{owner.__qualname__} is not decorated with keyword_only")


def builds(_placeholder: Callable[[], None]) -> _Build:
    """Declare ``build`` in a NamedTuple's body (the only declaration a NamedTuple's
    body takes besides fields is a method): ``@builds def build() -> None: ...``."""
    return _Build()


def keyword_only(cls: type[_N]) -> type[_N]:
    """Make a NamedTuple's constructor keyword-only, and define ``cls.build``.

    Money and token fields are ints side by side: a call by position that swapped
    two of them would still type-check. The generated ``__new__`` has the same
    fields and defaults, keyword-only, and builds the tuple as NamedTuple's does.

    ``cls.build(...)`` is the same constructor called as a plain function, which
    is what the request path uses: calling a class goes through ``type.__call__``,
    which packs the keywords into a dict, unpacks them for ``__new__`` and then
    calls ``__init__``: 0.6 to 1 µs per message here against 0.4 µs for ``build``,
    and a model call builds five messages. The class declares it (see
    :func:`builds`), so that the type checker knows it.
    """
    names = cls._fields
    defaults = cls._field_defaults
    env: dict[str, Any] = {f"_d_{name}": value for name, value in defaults.items()}
    env["_tuple_new"] = tuple.__new__
    env["_this"] = cls
    params = ", ".join(f"{n}=_d_{n}" if n in defaults else n for n in names)
    fields = ", ".join(names)
    source = (
        f"def __new__(_cls, *, {params}):\n    return _tuple_new(_cls, ({fields},))\n"
        f"def build(*, {params}):\n    return _tuple_new(_this, ({fields},))\n"
    )
    exec(source, env)
    new, build = env["__new__"], env["build"]
    new.__qualname__ = f"{cls.__qualname__}.__new__"
    build.__qualname__ = f"{cls.__qualname__}.build"
    # copy and pickle rebuild a tuple by position: through ``_make``, not ``__new__``
    make = cls._make

    def reduce(self: _N) -> tuple[Callable[[Iterable[Any]], _N], tuple[tuple[Any, ...]]]:
        return make, (tuple(self),)

    # methods replaced on the class, which the type checker cannot follow
    generated = {"__new__": staticmethod(new), "build": staticmethod(build), "__reduce__": reduce}
    for name, method in generated.items():
        setattr(cls, name, method)
    return cls


# --------------------------------------------------------------------- step 3


@keyword_only
class AdmitRequest(NamedTuple):
    """Count one request against the rate windows and maybe take an in-flight slot."""

    shard: int
    key: KeyState
    org_id: str
    rpm: int
    max_in_flight: int
    #: model calls take an in-flight slot; reads (GET /v1/key, usage...) do not
    take_slot: bool = True
    org_rpm: int | None = None
    #: with leases (several nodes): the key's id, which names its leases
    key_id: str | None = None

    @builds
    def build() -> None: ...


@keyword_only
class Admission(NamedTuple):
    """The verdict of step 3, with what the X-RateLimit-*-Requests headers need."""

    ok: bool
    code: AdmitCode | None
    retry_after: int | None
    #: who refused ("key", "org" or "platform"); None when admitted
    scope: Scope | None
    limit_requests: int
    remaining_requests: int
    reset_requests_s: int
    #: True when an in-flight slot is now held: settle with ``slot_taken=True``
    slot_taken: bool

    @builds
    def build() -> None: ...


# --------------------------------------------------------------------- step 8


@keyword_only
class ReserveRequest(NamedTuple):
    """Reserve the worst case of one call: tokens, key/parent spend, org money."""

    shard: int
    key: KeyState
    org_id: str
    #: worst-case tokens (estimated prompt + full output ceiling)
    tokens: int
    #: worst-case nano-USD counted against the key's and parent's spend caps
    cost: int
    #: the state of the key's parent (same family, so same shard); None for a root key
    parent: KeyState | None = None
    tpm: int | None = None
    key_usd_day: int | None = None
    key_usd_month: int | None = None
    parent_usd_day: int | None = None
    parent_usd_month: int | None = None
    #: nano-USD reserved against org credits and budget (0 for sandbox keys)
    org_cost: int = 0
    check_credits: bool = True
    #: with leases (several nodes): the key's and its parent's ids, naming their leases
    key_id: str | None = None
    parent_id: str | None = None

    @builds
    def build() -> None: ...


@keyword_only
class Reservation(NamedTuple):
    """A pending two-phase transfer; resolve it exactly once with a settle."""

    @property
    def ok(self) -> Literal[True]:
        return True

    id: int
    org_id: str
    tokens: int
    #: pending on the key's day and month windows
    key_nanos: int
    #: pending on the parent's day and month windows (0 without a parent)
    parent_nanos: int
    #: pending on the org's credits and monthly budget
    org_nanos: int
    #: the day window (days since epoch, UTC) the reservation was made in
    day: int
    #: the month window (year * 12 + month - 1, UTC) it was made in
    month: int
    #: with leases: what it took of them (:class:`~shards.leases.LeaseNeed`)
    leases: tuple[Any, ...] = ()

    @builds
    def build() -> None: ...


@keyword_only
class ReserveRefusal(NamedTuple):
    """Step 8 refused; nothing stays pending (tokens stay counted)."""

    @property
    def ok(self) -> Literal[False]:
        return False

    code: ReserveCode
    scope: Scope
    #: which limit: "tpm", "usd_day", "usd_month", "credits" or "budget_month"
    limit: str
    retry_after: int | None = None

    @builds
    def build() -> None: ...


# -------------------------------------------------------------------- step 10


@keyword_only
class SettleRequest(NamedTuple):
    """Release the slot and resolve the reservation (post the amounts, or void).

    Idempotent by reservation id: a settle whose reservation was already resolved
    is a duplicate and changes nothing, its ``slot_taken`` included, so a settle
    may be retried. (Without a reservation, the slot release is not deduplicated.)
    The reservation holds the parent and the org it was made against.
    """

    shard: int
    key: KeyState
    slot_taken: bool = False
    reservation: Reservation | None = None
    #: nano-USD counted against the key's and parent's caps (≤ reserved)
    cap_amount: int = 0
    #: nano-USD debited from org credits and counted in its budget (≤ reserved)
    billed_amount: int = 0
    #: with leases: the key's id (a slot goes back to its lease)
    key_id: str | None = None

    @builds
    def build() -> None: ...


# -------------------------------------------------------------------- reads


@keyword_only
class KeyStatusRequest(NamedTuple):
    """Read a key's windows for GET /v1/key; counts nothing, takes no slot."""

    shard: int
    key: KeyState
    rpm: int
    tpm: int | None
    max_in_flight: int
    usd_day: int | None
    usd_month: int | None

    @builds
    def build() -> None: ...


@keyword_only
class SpendWindow(NamedTuple):
    """One spend window of a key (``usage.day`` / ``usage.month``), in nano-USD."""

    spent: int
    reserved: int
    limit: int | None
    #: None when unlimited; never negative
    remaining: int | None
    #: epoch second at which the window rolls over
    resets_at: int

    @builds
    def build() -> None: ...


@keyword_only
class KeyStatus(NamedTuple):
    """What GET /v1/key reports under ``usage`` and ``rate_limit``."""

    day: SpendWindow
    month: SpendWindow
    rpm: int
    requests_this_minute: int
    tpm: int | None
    tokens_this_minute: int
    max_in_flight: int
    in_flight: int
    reset_requests_s: int

    @builds
    def build() -> None: ...


Message = AdmitRequest | ReserveRequest | SettleRequest | KeyStatusRequest
