"""The runtime: every long-lived part of one server, built once and handed to the app.

Start-up order (see :func:`gateway.serving.server.serve`): open the store; start the HTTP server
(it answers only health while starting); run the start-up work of
:attr:`Runtime.readiness` (settle the calls a crash left ``pending``,
:meth:`Runtime.recover`; load organisations, keys and today's and this month's settled
spend into memory and into the shards, then create the demo organisation on an empty
database); then start the store writer, the shards and the spend alerts, and be ready.
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import trio

from gateway import __version__
from gateway.accounts.catalog import (
    Catalog,
    Model,
    nanos_to_usd,
    provider_agrees,
    usd_to_nanos,
)
from gateway.accounts.key_record import KeyRecord, new_id
from gateway.accounts.keyring import Keyring
from gateway.accounts.orgs import Org
from gateway.calls.cache import ResponseCache
from gateway.calls.guardrails.rules import Guardrails
from gateway.calls.inflight import InFlight
from gateway.calls.keepalive import KeepaliveClock
from gateway.calls.lifecycle import CallParts
from gateway.calls.routing import Router
from gateway.calls.tokens import preload as preload_tokenizers
from gateway.config.settings import Config
from gateway.edge.public_limit import PublicCatalogLimiter
from gateway.errors import GatewayError
from gateway.observe.alerts import Alerts
from gateway.observe.logs import event
from gateway.observe.metrics import Metrics, shared_dir
from gateway.observe.refused_calls import RefusalCounts
from gateway.providers.base import Provider
from gateway.providers.guardrail_webhook import GuardrailWebhooks
from gateway.providers.mock import MockProvider
from gateway.providers.registry import build_providers, live_on_mock_message
from gateway.serving.node import Node
from gateway.serving.readiness import Readiness
from gateway.store import Store, StoreError, is_postgres, node_leases, records
from gateway.store import claims as idempotency_ops
from shards import ShardPool, SystemClock
from shards.clock import Clock

log = logging.getLogger("gateway.serving.runtime")
if TYPE_CHECKING:
    from gateway.observe.otel import OtlpSpans
    from gateway.store.claims import Claim

#: how long an /mcp request waits for the MCP part to be built at start-up
TOOLS_WAIT_S = 30.0
DEMO_ORG_NAME = "demo"
DEMO_CREDITS_USD = 100.0


@dataclass
class Runtime:
    config: Config
    store: Store
    clock: Clock = field(default_factory=SystemClock)
    admin_token: str | None = None

    def __post_init__(self) -> None:
        self.pool = ShardPool(
            n_shards=self.config.server.shards,
            clock=self.clock,
            platform_rpm=self.config.server.platform_rpm,
        )
        self.keyring = Keyring(self.store, self.pool.key_ref, self.clock.now)
        self.catalog = Catalog(self.config)
        self.orgs: dict[str, Org] = {}
        #: calls in progress under an Idempotency-Key, by (key id, Idempotency-Key); see
        #: :mod:`gateway.edge.idempotency`
        self.idempotency_claims: dict[tuple[str, str], Claim] = {}
        self.inflight = InFlight()
        self.alerts = Alerts(self.store, self.keyring, self.pool, self.config.server, self.clock)
        self.byok: dict[tuple[str, str], str] = {}
        self.mock = MockProvider.for_models(self.config.models, clock=self.clock.now)
        self.providers: dict[str, Provider] = build_providers(
            self.config, self.mock, self.provider_secrets
        )
        #: the root nursery of the server, where stream pumps run (set by serve())
        self.nursery: trio.Nursery | None = None
        self.public_limiter = PublicCatalogLimiter(
            self.config.server.public_catalog_rpm, self.clock.now
        )
        #: the exported traces (``[observability] otlp_endpoint``), else None
        self.spans = self._open_spans()
        self.metrics = Metrics(
            enabled=self.config.server.metrics,
            version=__version__,
            models=(model.id for model in self.config.models),
            providers=(provider.name for provider in self.config.providers),
            mailbox_depths=lambda: self.pool.statistics().queue_lengths,
            dropped_spans=self.spans.dropped if self.spans is not None else None,
            group_dir=shared_dir() if self.config.server.workers > 1 else None,
        )
        if self.spans is not None:
            self.spans.counts.on_drop = self.metrics.spans_dropped
        self.store.on_commit = self.metrics.store_committed
        self.readiness = Readiness(startup=[self.start_up])
        #: whether the start-up work makes demo data on an empty database: only under the
        #: embedded default (no config file) or when ``serve --demo`` asks
        self.demo = self.config.source is None
        #: the sandbox key made by the start-up work on an empty database (shown once)
        self.demo_token: str | None = None
        #: this process as one of several nodes (a PostgreSQL store, or a worker of
        #: ``serve --workers``), else None
        several = is_postgres(self.config.server.db) or self.config.server.workers > 1
        #: the response cache (``[cache]``), None when off
        self.cache = (
            ResponseCache(self.config.cache, self.store, self.clock, self.metrics, shared=several)
            if self.config.cache.enabled
            else None
        )
        self.cluster: Node | None = Node(self) if several else None
        #: the client of ``webhook`` guardrails
        self.guardrail_webhooks = GuardrailWebhooks()
        #: refused calls of known keys, counted by key, code and day
        self.refusals = RefusalCounts(
            self.store, self.clock.now, self.cluster.node_id if self.cluster else None
        )
        #: what a model call uses of this server (the calls/ layer sees nothing else)
        self.call_parts = CallParts(
            store=self.store,
            clock=self.clock,
            shards=self,
            policy=self,
            inflight=self.inflight,
            notice_spend=self.alerts.notice,
            ledger_row=self.ledger_row,
            provider_for=self.provider_for,
            provider_key=self.provider_key,
            node_id=self.cluster.node_id if self.cluster is not None else None,
            request_timeout_s=self.config.server.request_timeout_s,
            keepalive_s=self.config.server.keepalive_s,
            keepalives=KeepaliveClock(self.config.server.keepalive_s),
            nursery=lambda: self.nursery,
            router=Router(metrics=self.metrics),
            spans=self.spans,
            guardrails=Guardrails.build(
                self.config.guardrails, self.guardrail_webhooks.ask, self.metrics.guardrail_verdict
            ),
            cache=self.cache,
        )
        #: what an MCP tools/call uses (gateway/tools/walk.py ToolParts), once
        #: :meth:`start_tools` built it
        self._tool_parts: Any = None
        self._tools_started = False
        self._tools_built = trio.Event()

    async def start_tools(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """The MCP part (``/mcp``, gateway/tools/): its SDK imported on a thread, off the
        event loop (it costs a start about half a second and 35 MB), then the upstreams'
        sessions, kept until the server stops. Started after the server is ready when
        ``[[mcp_servers]]`` are configured (stdio servers start with the gateway), else by
        the first ``/mcp`` request. A failure here is logged and answered 503 on ``/mcp``;
        it never stops the server."""
        self._tools_started = True
        try:
            walk = await trio.to_thread.run_sync(importlib.import_module, "gateway.tools.walk")
            catalog = importlib.import_module("gateway.tools.tool_catalog")
            self._tool_parts = walk.ToolParts(
                calls=self.call_parts,
                catalog=catalog.ToolCatalog(self.config.mcp_servers, os.environ),
                metrics=self.metrics,
                unasked=self.mock,
            )
        except Exception:  # the MCP part only: the rest of the server goes on
            log.exception("the MCP tools could not start", extra=event("mcp_start_failed"))
            return
        finally:
            self._tools_built.set()
        await self._tool_parts.catalog.run(task_status=task_status)

    async def tools(self) -> Any:
        """What a tool call uses (gateway/tools/walk.py ``ToolParts``), once built."""
        if not self._tools_started and self.nursery is not None:
            self._tools_started = True
            self.nursery.start_soon(self.start_tools)
        with trio.move_on_after(TOOLS_WAIT_S):
            await self._tools_built.wait()
        if self._tool_parts is None:
            raise GatewayError("admission_unavailable", "The MCP tools are not available yet.")
        return self._tool_parts

    def _open_spans(self) -> OtlpSpans | None:
        if self.config.observability.otlp_endpoint is None:
            return None
        # imported only when traces are on: the SDK and its HTTP client take ~0.6 s
        from gateway.observe.otel import OtlpSpans

        kinds = {provider.name: provider.kind for provider in self.config.providers}
        return OtlpSpans(self.config.observability, kinds)

    @classmethod
    def open(
        cls, config: Config, clock: Clock | None = None, *, take_over: bool = False
    ) -> Runtime:
        """The runtime over its store; the state is loaded by the start-up work.
        ``take_over``: see :meth:`Node.register`."""
        store = Store(config.server.db)
        runtime = cls(
            config=config,
            store=store,
            clock=clock or SystemClock(),
            admin_token=os.environ.get("SVC_ADMIN_TOKEN") or None,
        )
        if runtime.cluster is not None:
            try:
                runtime.cluster.register(take_over=take_over)
            except StoreError:
                store.close()
                raise
        return runtime

    async def start_up(self) -> None:
        """The start-up work: the rebuild from the store, then the demo bootstrap (if
        ``demo``).

        On a worker thread, so that the server answers /healthz and /readyz meanwhile.
        Nothing reads or changes this state concurrently: until the phase is READY only
        the health paths are served, and the store writer and the shards are not started.
        """

        def work() -> None:
            self.load()
            preload_tokenizers(self.config.models)
            self.demo_token = self.bootstrap_demo() if self.demo else None

        await trio.to_thread.run_sync(work)

    def load(self) -> None:
        """Rebuild the in-memory state from the store (start-up only), after recovery."""
        if self.cluster is not None:
            self.cluster.recover()
        else:
            self.recover()
            # the operator's model switches outlive a restart (a cluster's node reads them)
            for model_id, enabled in self.store.call(node_leases.model_switches).items():
                self.catalog.set_enabled(model_id, enabled)
        self.load_orgs(
            self.store.call(records.list_orgs),
            self.store.call(records.org_balances),
            self.store.call(records.org_billed, self.month()),
        )
        self.keyring.load(self.store.call(records.all_keys))
        self.store.call(idempotency_ops.purge, self.clock.now() - idempotency_ops.RETENTION_S)
        self.alerts.load()
        for row in self.store.call(records.list_provider_credentials):
            self.byok[(row["org_id"], row["provider"])] = row["api_key_env"]
        now = datetime.fromtimestamp(self.clock.now(), UTC)
        day, month = now.strftime("%Y-%m-%d"), now.strftime("%Y-%m")
        totals: dict[str, list[int]] = {}
        for row in self.store.call(records.settled_spend, day, month):
            # a parent's windows hold its whole family's spend, as its caps count it: the
            # parent of the call's time (a rotation has since moved sub-keys on)
            for key_id in filter(None, (row["key_id"], row["parent_id"])):
                total = totals.setdefault(key_id, [0, 0])
                total[0] += row["day_nanos"] or 0
                total[1] += row["month_nanos"] or 0
        for key_id, (day_nanos, month_nanos) in totals.items():
            record = self.keyring.get(key_id)
            if record is not None:
                self.pool.load_spend(record.id, record.family_id, day_nanos, month_nanos)
        if self.cluster is not None:
            self.cluster.renew_now()  # the rebuild may have taken a good part of a lease

    def recover(self) -> None:
        """Settle the calls a crash left in flight, before the rebuild counts spend.

        Every ``pending`` request row belongs to a process that is gone (one server per
        database): it is settled by the settlement table's row "anything else without
        reported usage" (:func:`records.recover_pending`), so the rebuild below counts
        its full reservation against the caps of its key and parent.
        """
        found = self.store.call(records.recover_pending)
        if found["calls"]:
            calls, usd = found["calls"], nanos_to_usd(found["nanos"])
            log.warning(
                "recovery: %d interrupted calls settled, %s USD counted against caps",
                calls,
                usd,
                extra=event("recovery", calls=calls, settled_usd=usd),
            )

    def load_orgs(
        self,
        rows: list[dict[str, Any]],
        balances: dict[str, dict[str, int]],
        billed: dict[str, int],
    ) -> None:
        """Organisations and their accounts as the store has them (start-up, and a
        node's reload after another node changed them)."""
        for row in rows:
            org = Org.from_row(row)
            self.orgs[org.id] = org
            self._load_org_account(org, balances.get(org.id, {}), billed.get(org.id, 0))

    def _load_org_account(self, org: Org, balance: dict[str, int], billed: int = 0) -> None:
        budget = org.policy.get("budget_usd_month")
        self.pool.set_org(
            org.id,
            credits_nanos=balance.get("purchased", 0) - balance.get("used", 0),
            budget_month_nanos=usd_to_nanos(budget) if budget is not None else None,
            billed_month_nanos=billed,
        )

    def month(self) -> str:
        return datetime.fromtimestamp(self.clock.now(), UTC).strftime("%Y-%m")

    # -- organisations ---------------------------------------------------------------------

    def org_from_new(self, name: str, residency: str | None) -> Org:
        return Org(id=new_id("org"), name=name, residency=residency, created_at=time.time())

    def ledger_row(self, org_id: str, amount_nanos: int, kind: str) -> dict[str, object]:
        return {
            "org_id": org_id,
            "amount_nanos": amount_nanos,
            "kind": kind,
            "request_id": None,
            "created_at": self.clock.now(),
        }

    def bootstrap_demo(self) -> str | None:
        """On an empty database: a demo organisation and a sandbox key; returns its token."""
        if self.orgs:
            return None
        org = self.org_from_new(DEMO_ORG_NAME, None)
        self.store.call(records.create_org, org.to_row())
        credits = usd_to_nanos(DEMO_CREDITS_USD)
        self.store.call(records.add_ledger_row, self.ledger_row(org.id, credits, "purchase"))
        self.orgs[org.id] = org
        self._load_org_account(org, {"purchased": credits})
        record, token = self.keyring.build(
            org_id=org.id,
            name="sandbox",
            mode="sandbox",
            environment="development",
            scopes=("inference", "embeddings", "usage:read", "keys:manage"),
        )
        self.keyring.insert_now(record)
        return token

    # -- providers ---------------------------------------------------------------------------

    def provider_for(self, record: KeyRecord, model: Model) -> Provider:
        """Sandbox keys are served by the mock; live keys by the model's provider, never
        by the mock (the spec: live keys are served by real providers and billed)."""
        if record.mode == "sandbox":
            return self.mock
        if self.config.provider(model.config.provider).kind == "mock":
            # a setup to change, not a passing failure: retrying cannot succeed
            raise GatewayError(
                "model_unavailable", live_on_mock_message(model.id), "model", retryable=False
            )
        provider = self.providers.get(model.config.provider)
        if provider is None:
            raise GatewayError(
                "model_unavailable", f"The provider of {model.id} is not available.", "model"
            )
        return provider

    def provider_key(self, record: KeyRecord, model: Model) -> str | None:
        """The upstream credential: the organisation's own for BYOK keys, else ours."""
        if record.mode == "sandbox":
            return None
        if record.byok:
            env = self.byok_env(record.org_id, model.config.provider)
        else:
            env = self.config.provider(model.config.provider).api_key_env
        return os.environ.get(env) if env else None

    def provider_secrets(self) -> list[str]:
        """Every upstream credential this server can send now: the providers' keys and
        the organisations' BYOK keys (read at each use, as :meth:`provider_key` does);
        a bedrock provider's key id, secret key and session token."""
        names = {p.api_key_env for p in self.config.providers} | set(self.byok.values())
        for p in self.config.providers:
            if p.kind == "bedrock":
                names |= {p.access_key_id_env, p.secret_access_key_env, p.session_token_env}
        return [value for name in names if name and (value := os.environ.get(name))]

    async def aclose_providers(self) -> None:
        for provider in self.providers.values():
            aclose = getattr(provider, "aclose", None)
            if aclose is not None:
                await aclose()
        await self.guardrail_webhooks.aclose()

    def byok_env(self, org_id: str, provider: str) -> str | None:
        return self.byok.get((org_id, provider))

    def zero_retention(self, provider: str) -> bool:
        return provider_agrees(self.config, provider)

    def serves_residency(self, provider: str, residency: str | None) -> bool:
        """A provider with no residency list serves every zone."""
        if residency is None:
            return True
        zones = self.config.provider(provider).residency
        return not zones or residency in zones
