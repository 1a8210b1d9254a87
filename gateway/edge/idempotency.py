"""Idempotent retries: the ``Idempotency-Key`` header on chat completions and responses.

A key (scoped to the calling API key, kept 24 hours) remembers the body it came with
(canonical JSON, with the endpoint) and the outcome of its first call:

    first call                          a retry with the same key and body
    ----------------------------------  -----------------------------------------------
    still running                       409 idempotency_conflict (retryable), names it
    answered 200, not streamed          the stored answer again: same body, same request
                                        id; no provider call, no charge, no record
    streamed, or zero-retention key     409 idempotency_conflict naming the original
                                        (its record is at GET /v1/requests/{id})
    interrupted (the server died        409 idempotency_conflict naming the original,
      during the call)                  whose record says interrupted
    refused or failed (any error)       nothing kept: the retry is a new attempt
    a different body                    422 idempotency_key_reused (param Idempotency-Key)

Claimed first, settled together: the claim is a row of the ``idempotency`` table
(state ``running``) written in the same transaction as the call's pending request row,
before the provider is asked; its outcome is written (or the row dropped) in the same
transaction as the call's settlement. So a process that dies mid-call leaves a claim
that start-up recovery marks ``interrupted`` with the record: the provider is never
called twice for one key. The claim is an insert that does nothing on an existing row
(:func:`gateway.store.claims.claim`): of attempts racing on several nodes, the one
whose insert lands runs; every other is a repeat of it (:class:`ClaimHeld`), even one
that was already admitted and reserved (its reservation is voided, nothing recorded).

A repeat is answered from the store's row, read first: the stored answer, or the 409
naming the attempt that holds the claim. Only an attempt that found no row enters
``Runtime.idempotency_claims`` (this process's attempts between that read and their
claim): a repeat arriving then is the 409 naming it. An attempt that has not read yet
is never named, so retries of a finished key arriving together each get its answer
(the old shortcut, before any read, named a retry that was only reading the row).

A repeat (replay, 409 or 422) is admitted like every request: it counts in the key's
request window and carries the rate-limit headers, but takes no in-flight slot and
reserves nothing. Only a call that runs goes through step 3 with a slot.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson
import outcome
import trio
from quart import Response, g, request

from gateway.calls.inflight import STOPPING_MESSAGE
from gateway.edge.auth import admit_request
from gateway.edge.http import request_id
from gateway.errors import GatewayError
from gateway.store import claims as store_ops
from gateway.store.claims import RETENTION_S, Claim, ClaimHeld

if TYPE_CHECKING:
    from gateway.accounts.key_record import KeyRecord
    from gateway.serving.runtime import Runtime

HEADER = "Idempotency-Key"
MAX_LENGTH = 255
IN_PROGRESS_RETRY_AFTER = 1


def header_value() -> str | None:
    """The request's Idempotency-Key, or None; 400 invalid_request when malformed."""
    value = request.headers.get(HEADER)
    if value is None:
        return None
    if not value or len(value) > MAX_LENGTH or not value.isprintable():
        raise GatewayError(
            "invalid_request",
            f"{HEADER} must be 1 to {MAX_LENGTH} printable characters.",
            param=HEADER,
        )
    return value


def body_hash(endpoint: str, body: dict[str, Any]) -> str:
    canonical = orjson.dumps([endpoint, body], option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()


async def serve(
    rt: Runtime,
    record: KeyRecord,
    endpoint: str,
    idem_key: str,
    body: dict[str, Any],
    run: Callable[[Claim], Awaitable[Response]],
) -> Response:
    """Answer once per (key, Idempotency-Key): ``run`` the call under a claim, or replay
    or refuse a repeat.

    A repeat is admitted like every request (it counts in the key's request window) but
    takes no in-flight slot and reserves nothing: with ``max_in_flight`` 1, a retry while
    the original runs is the 409 that names it, not a 429. Which attempt calls the
    provider is decided by the store's claim (:func:`gateway.store.claims.claim`),
    across nodes.

    A call that is not streamed runs in the server's nursery, not the handler's: a
    client that leaves (its handler cancelled) does not cut it. It runs on within its
    deadline, settled on its usage, its answer stored: the client's retry gets that
    answer, and the provider is never asked twice.
    """
    slot = (record.id, idem_key)
    digest = body_hash(endpoint, body)

    async def attempt() -> Response:
        row = await rt.store.read(store_ops.get, *slot)
        if row is not None and row["created_at"] > rt.clock.now() - RETENTION_S:
            await admit_request(rt, record)
            return _repeat(row, digest)
        running = rt.idempotency_claims.get(slot)
        if running is not None:  # past its read too, about to claim (or claimed since)
            await admit_request(rt, record)
            _refuse_repeat(running.body_hash, digest, running.request_id, in_progress=True)
        claim = rt.idempotency_claims[slot] = Claim(idem_key, digest, request_id())
        try:
            return await run(claim)
        except ClaimHeld as held:  # another attempt's claim won the insert
            return _repeat(held.row, digest)
        finally:
            del rt.idempotency_claims[slot]

    if body.get("stream") is True or rt.nursery is None:
        return await attempt()  # a stream's pump outlives its client already
    return await _outliving_the_client(rt.nursery, attempt)


async def _outliving_the_client(
    nursery: trio.Nursery, attempt: Callable[[], Awaitable[Response]]
) -> Response:
    """``attempt()`` in ``nursery`` (the server's): the caller gets its answer or its
    error; a caller cancelled meanwhile leaves it running to its end."""
    done = trio.Event()
    result: list[outcome.Outcome[Response]] = []

    async def detached() -> None:
        try:
            result.append(outcome.Value(await attempt()))
        except Exception as exc:  # the server stopping (Cancelled) ends it: not kept
            result.append(outcome.Error(exc))
        finally:
            done.set()

    nursery.start_soon(detached)  # in a copy of this request's context (quart's g, ids)
    await done.wait()
    if not result:
        raise GatewayError("service_unavailable", STOPPING_MESSAGE)
    return result[0].unwrap()


def _repeat(row: dict[str, Any], digest: str) -> Response:
    """The answer to a repeat of the claim ``row``: 422, 409, or the stored answer."""
    in_progress = row["state"] == store_ops.RUNNING  # still being called, or pumped
    _refuse_repeat(row["body_hash"], digest, row["request_id"], in_progress=in_progress)
    return _replay(row)


def _refuse_repeat(stored_hash: str, digest: str, original: str, *, in_progress: bool) -> None:
    """The refusals of a repeat: another body (422), or an answer that cannot be replayed."""
    if stored_hash != digest:
        raise GatewayError(
            "idempotency_key_reused",
            f"This {HEADER} was used with a different request body (request {original}).",
            param=HEADER,
        )
    if in_progress:
        raise GatewayError(
            "idempotency_conflict",
            f"The request {original} with this {HEADER} is still in progress.",
            param=HEADER,
            retry_after=IN_PROGRESS_RETRY_AFTER,
            retryable=True,  # the original's answer will be there (or it failed: a new try)
        )


def _replay(row: dict[str, Any]) -> Response:
    if row["state"] != store_ops.STORED:
        if row["state"] == store_ops.INTERRUPTED:
            why = "was interrupted (the server stopped during the call)"
        else:
            why = "was streamed" if row["stream"] else "was not stored (zero retention)"
        raise GatewayError(
            "idempotency_conflict",
            f"The answer to request {row['request_id']} with this {HEADER} {why}; "
            f"see GET /v1/requests/{row['request_id']}.",
            param=HEADER,
        )
    g.request_id = row["request_id"]  # the replay is the original answer, id included
    return Response(row["body"], status=row["status"], headers=row["headers"])
