"""Spend alerts: threshold events for organisations with a webhook, delivered at least once.

Thresholds (50 %, 80 % and 100 %) of a key's daily and monthly spend caps (settled
spend, the money that counts against them), of the organisation's monthly budget (billed
spend this month) and of its purchased credits (the share used: debits over purchases,
both from the credit ledger). A crossing is an
event with a deterministic id — scope, subject, metric, window and threshold — so it is
emitted once per window: the day or the month of a cap, and for credits the total
purchased so far (a top-up opens a new window).

Flow: :meth:`Alerts.notice` is called after each settlement; it only queues the key
(never blocks the call). A checker task reads the key's windows from its shard and the
organisation's credits, and writes each new crossing to the ``webhook_events`` outbox
(INSERT OR IGNORE on the id). A delivery task posts due events to the organisation's
URL, signed; only a 2xx answer (redirects are not followed) delivers it. A failure is
retried after ``[server] webhook_retry_s`` seconds, doubling up to an hour, and given up
after ``webhook_max_attempts`` attempts. The outbox survives restarts, so a pending
event is retried by the next process.

Signature: ``Svc-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>``;
the event id is also in ``Svc-Webhook-Id`` so receivers can drop duplicates.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import math
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson
import trio

from gateway.accounts.catalog import nanos_to_usd, usd_to_nanos
from gateway.accounts.key_record import key_ref
from gateway.errors import GatewayError
from gateway.observe.logs import event as log_event
from gateway.store import StoreError
from gateway.store import webhooks as ops
from shards import ShardUnavailable, SpendWindow

if TYPE_CHECKING:
    import httpx

    from gateway.accounts.key_record import KeyRecord
    from gateway.accounts.keyring import Keyring
    from gateway.config.settings import ServerConfig
    from gateway.store import Store
    from shards import ShardPool
    from shards.clock import Clock

log = logging.getLogger("gateway.observe.alerts")

THRESHOLDS = (50, 80, 100)
EVENT_TYPE = "spend.threshold_crossed"
QUEUE = 1024
DELIVERY_TIMEOUT_S = 5.0
POLL_S = 1.0
MAX_BACKOFF_S = 3600.0
MAX_URL = 2000
MAX_IN_FLIGHT = 32
MAX_IN_FLIGHT_PER_ORG = 4
#: event ids older than this are not kept in memory (no window is longer than a month)
MEMORY_S = 40 * 24 * 3600


@dataclass(frozen=True, slots=True)
class Reading:
    """One metric of one subject: how much of its limit is used in which window."""

    scope: str  # "key" or "org"
    subject: str  # key id or org id
    metric: str  # "usd_day", "usd_month", "budget_month" or "credits"
    window: str
    used: int  # nano-USD
    limit: int  # nano-USD


def event_id(reading: Reading, pct: int) -> str:
    raw = f"{reading.scope}|{reading.subject}|{reading.metric}|{reading.window}|{pct}"
    return "evt_" + hashlib.sha256(raw.encode()).hexdigest()[:24]


def crossed(reading: Reading) -> list[int]:
    if reading.limit <= 0:
        return list(THRESHOLDS) if reading.used > 0 else []
    return [pct for pct in THRESHOLDS if reading.used * 100 >= pct * reading.limit]


def _window(spend: SpendWindow, form: str) -> str:
    """The name of a shard spend window: its UTC day or month (taken from its reset)."""
    return datetime.fromtimestamp(spend.resets_at - 1, UTC).strftime(form)


def check_webhook_url(url: object) -> str:
    """An absolute http(s) URL with a host (any host: where alerts go is the operator's call)."""
    import httpx  # in the functions that use it: `serve` starts ~0.1 s sooner without it

    try:
        parsed = httpx.URL(url) if isinstance(url, str) and len(url) <= MAX_URL else None
    except httpx.InvalidURL:
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise GatewayError("invalid_request", "url must be an absolute http(s) URL.", param="url")
    return str(url)


def sign(secret: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def new_secret() -> str:
    return "whsec_" + secrets.token_urlsafe(32)


class Alerts:
    """Detection, the outbox and delivery of one server's spend alerts.

    It reads keys from the keyring, their windows and organisations' accounts from the
    shard pool, credits and the outbox from the store; time from the server's clock.
    """

    def __init__(
        self,
        store: Store,
        keyring: Keyring,
        pool: ShardPool,
        server: ServerConfig,
        clock: Clock,
    ) -> None:
        self.store = store
        self.keyring = keyring
        self.pool = pool
        self.server = server
        self.clock = clock
        self.urls: dict[str, str] = {}  # org id -> URL (orgs without one get no events)
        self.emitted: set[str] = set()
        self._queued: set[str] = set()  # key ids waiting in the channel
        self._checking = 0  # keys queued or being checked
        self._delivering: dict[str, str] = {}  # event id -> org id, on their way
        # deliveries that ended while the delivery loop's read of due events ran: that
        # read may have seen their rows before the end was written (sent twice otherwise)
        self._ended_in_read: set[str] = set()
        self._changed = trio.Event()  # set (and replaced) when either goes down
        self._send, self._receive = trio.open_memory_channel[tuple[str, str]](QUEUE)
        self._wake = trio.Event()
        self._scope = trio.CancelScope()
        self._stopped = trio.Event()

    def load(self) -> None:
        """At start-up: the endpoints, and the ids of events already emitted."""
        store = self.store
        self.urls = {row["org_id"]: row["url"] for row in store.call(ops.all_webhooks)}
        since = self.clock.now() - MEMORY_S
        self.emitted = set(store.call(ops.event_ids_since, since))

    async def set_webhook(self, org_id: str, url: str) -> str:
        """Point the organisation's alerts at ``url``; returns the new signing secret."""
        secret = new_secret()
        row = {"org_id": org_id, "url": url, "secret": secret, "created_at": self.clock.now()}
        await self.store.write(ops.set_webhook, row)
        self.urls[org_id] = url
        return secret

    def notice(self, record: KeyRecord, settled_nanos: int) -> None:
        """After a settlement: have the key (and its organisation) checked, soon."""
        if not settled_nanos or record.org_id not in self.urls or record.id in self._queued:
            return  # a key already waiting for its check is checked once, after both
        with contextlib.suppress(trio.WouldBlock):  # a later settlement checks again
            self._send.send_nowait((record.id, record.org_id))
            self._queued.add(record.id)
            self._checking += 1

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Check and deliver until :meth:`aclose` (or the server's cancellation)."""
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._check_loop)
                    nursery.start_soon(self._deliver_loop)
                    task_status.started()
        finally:
            self._stopped.set()

    async def aclose(self) -> None:
        """Stop, and wait until stopped: called while the store still runs, so that a
        store write on its way (they are shielded) completes instead of waiting forever
        on a writer that is gone."""
        self._scope.cancel()
        await self._stopped.wait()

    async def wait_quiet(self) -> None:
        """Return once every key noticed so far has been checked and no event is left to
        deliver: none on its way, none due or waiting for a retry (given-up ones aside).
        After that, nothing more is sent until the next settlement."""
        while True:
            changed = self._changed
            busy = self._checking or self._delivering
            if not busy and not await self.store.read(ops.undelivered_count):
                return
            await changed.wait()

    def _note_change(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    # -- detection ---------------------------------------------------------------------

    async def _check_loop(self) -> None:
        async for key_id, org_id in self._receive:
            self._queued.discard(key_id)
            try:
                await self._check(key_id, org_id)
            except (ShardUnavailable, StoreError) as exc:
                # alerts never take the server down; the next settlement checks again
                log.warning("spend alert check skipped: %s", exc)
            finally:
                self._checking -= 1
                self._note_change()

    async def _check(self, key_id: str, org_id: str) -> None:
        keyring = self.keyring
        record = keyring.get(key_id)
        parent = keyring.get(record.parent_id) if record and record.parent_id else None
        readings: list[Reading] = []
        for key in (record, parent):
            if key is not None:
                readings += await self._key_readings(key)
        readings += await self._credit_readings(org_id)
        readings += self._budget_readings(org_id)
        for reading in readings:
            for pct in crossed(reading):
                await self._emit(org_id, reading, pct)

    async def _key_readings(self, record: KeyRecord) -> list[Reading]:
        caps = record.caps
        if caps.usd_day is None and caps.usd_month is None:
            return []
        status = await self.pool.key_status(
            key_ref(record),
            rpm=caps.rpm,
            tpm=caps.tpm,
            max_in_flight=caps.max_in_flight,
            usd_day=None,
            usd_month=None,
        )
        windows = (
            ("usd_day", caps.usd_day, status.day, "%Y-%m-%d"),
            ("usd_month", caps.usd_month, status.month, "%Y-%m"),
        )
        return [
            Reading("key", record.id, metric, _window(spend, form), spend.spent, usd_to_nanos(cap))
            for metric, cap, spend, form in windows
            if cap is not None
        ]

    async def _credit_readings(self, org_id: str) -> list[Reading]:
        # both from the ledger, in one read: a settlement's debit is committed before it
        # settles, and a top-up is never seen half-applied
        purchased, used = await self.store.read(ops.credit_totals, org_id)
        if purchased <= 0:
            return []
        return [Reading("org", org_id, "credits", f"purchased:{purchased}", used, purchased)]

    def _budget_readings(self, org_id: str) -> list[Reading]:
        """The organisation's monthly budget (policy ``budget_usd_month``) against its billed
        spend this month, as the shard pool's organisation book counts it."""
        snap = self.pool.org_snapshot(org_id)
        if snap.budget_month is None:
            return []
        month = datetime.fromtimestamp(self.clock.now(), UTC).strftime("%Y-%m")
        return [Reading("org", org_id, "budget_month", month, snap.month_billed, snap.budget_month)]

    async def _emit(self, org_id: str, reading: Reading, pct: int) -> None:
        evt = event_id(reading, pct)
        if evt in self.emitted:
            return
        created = self.clock.now()
        data: dict[str, Any] = {
            "scope": reading.scope,
            "org_id": org_id,
            "metric": reading.metric,
            "window": reading.window,
            "threshold_pct": pct,
            "used_usd": nanos_to_usd(reading.used),
            "limit_usd": nanos_to_usd(reading.limit),
        }
        if reading.scope == "key":
            data["key_id"] = reading.subject
        payload = {"id": evt, "type": EVENT_TYPE, "created": math.floor(created), "data": data}
        row = {
            "id": evt,
            "org_id": org_id,
            "payload": orjson.dumps(payload).decode(),
            "created_at": created,
            "attempts": 0,
            "next_attempt_at": 0.0,
        }
        await self.store.write(ops.add_event, row)
        self.emitted.add(evt)
        self._wake.set()

    # -- delivery ----------------------------------------------------------------------

    async def _deliver_loop(self) -> None:
        """Post due events, each in its own task, so that a slow receiver holds up no other.

        At most ``MAX_IN_FLIGHT`` deliveries at once and ``MAX_IN_FLIGHT_PER_ORG`` per
        organisation; an event already on its way is not picked again.
        """
        in_flight = self._delivering
        paused = False  # said once when the store goes away, once when it is back
        # made at the first delivery, not at start: httpx's import and its TLS context (the
        # CA bundle) were ~0.1 s of every start, most of which never deliver an event
        client: httpx.AsyncClient | None = None
        try:
            async with trio.open_nursery() as nursery:
                while True:
                    self._wake = trio.Event()
                    limit = len(in_flight) + MAX_IN_FLIGHT
                    self._ended_in_read = ended = set[str]()
                    try:
                        due = await self.store.read(ops.due_events, self.clock.now(), limit)
                    except StoreError as exc:
                        if not paused:
                            log.warning("webhook delivery paused: %s", exc)
                        paused, due = True, []
                    else:
                        if paused:
                            log.info("webhook delivery resumed")
                        paused = False
                    for event in due:
                        busy = list(in_flight.values()).count(event["org_id"])
                        if len(in_flight) >= MAX_IN_FLIGHT:
                            break
                        if event["id"] in in_flight or event["id"] in ended:
                            continue  # on its way, or its row as read is already stale
                        if busy >= MAX_IN_FLIGHT_PER_ORG:
                            continue
                        in_flight[event["id"]] = event["org_id"]
                        if client is None:
                            import httpx

                            client = httpx.AsyncClient(timeout=DELIVERY_TIMEOUT_S)
                        nursery.start_soon(self._deliver, client, event, in_flight)
                    with trio.move_on_after(POLL_S):
                        await self._wake.wait()
        finally:
            if client is not None:
                with trio.CancelScope(shield=True):
                    await client.aclose()

    async def _deliver(
        self, client: httpx.AsyncClient, event: dict[str, Any], in_flight: dict[str, str]
    ) -> None:
        try:
            error = await self._post(client, event)
            attempts = event["attempts"] + 1
            fields = {"event_id": event["id"], "org_id": event["org_id"], "attempts": attempts}
            if error is None:
                await self.store.write(ops.mark_delivered, event["id"], self.clock.now())
                log.info(
                    "webhook event %s delivered",
                    event["id"],
                    extra=log_event("alert_delivery", outcome="delivered", **fields),
                )
                return
            server = self.server
            backoff = min(server.webhook_retry_s * 2 ** (attempts - 1), MAX_BACKOFF_S)
            give_up = attempts >= server.webhook_max_attempts
            outcome = "given_up" if give_up else "retry"
            log.warning(
                "webhook event %s not delivered (%s): %s",
                event["id"],
                error,
                "given up" if give_up else f"retry in {backoff:g} s",
                extra=log_event("alert_delivery", outcome=outcome, error=error, **fields),
            )
            await self.store.write(
                ops.mark_failed, event["id"], attempts, self.clock.now() + backoff, error, give_up
            )
        except StoreError as exc:  # the row stays due: it is sent again, at least once
            log.warning("webhook event %s not updated: %s", event["id"], exc)
        finally:
            del in_flight[event["id"]]
            self._ended_in_read.add(event["id"])
            self._wake.set()
            self._note_change()

    async def _post(self, client: httpx.AsyncClient, event: dict[str, Any]) -> str | None:
        """One signed attempt, bounded in time; the error, or None when a 2xx came back."""
        import httpx

        body = event["payload"].encode()
        timestamp = int(self.clock.now())
        headers = {
            "Content-Type": "application/json",
            "Svc-Webhook-Id": event["id"],
            "Svc-Signature": sign(event["secret"], timestamp, body),
        }
        with trio.move_on_after(DELIVERY_TIMEOUT_S):
            try:
                # the answer's body is never read: only its status counts
                async with client.stream("POST", event["url"], content=body, headers=headers) as r:
                    return None if 200 <= r.status_code < 300 else f"HTTP {r.status_code}"
            except (httpx.HTTPError, httpx.InvalidURL) as exc:
                return type(exc).__name__
        return "timeout"
