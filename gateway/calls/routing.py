"""Which deployment of a model an attempt goes to, and each deployment's health on this node.

A model lists deployments (``[[models.deployments]]``: provider, upstream id, weight,
the upstream account's rpm/tpm). For one call, :meth:`Router.plan` orders the deployments
that may serve its key (:func:`gateway.calls.policy.open_deployments`):

    strategy     order of the deployments that are neither cooling nor over their limits
    ----------   ---------------------------------------------------------------------------
    ordered      as configured (priority failover)
    weighted     drawn at random by weight, without replacement (the default; equal weights)
    least_busy   fewest attempts in flight on this node first (ties at random)
    latency      lowest recent time to first byte first (a moving average); unmeasured ones
                 first, and one plan in :data:`EXPLORE` drawn at random (exploration)

A deployment is skipped while it cools down (after a 429, for its Retry-After bounded to
[:data:`MIN_COOLDOWN_S`, :data:`MAX_COOLDOWN_S`]; after :data:`FAILURES_TO_COOL`
consecutive failures, :data:`FAILURE_COOLDOWN_S` doubling per further failure up to the
bound; at once for :data:`MAX_COOLDOWN_S` when our credential was refused) and while over
its own rpm or tpm (counted per node over the last minute). When every open deployment is
skipped, all are tried, the least recently failed first: the router never refuses a call
without trying.

Everything here is per node (per process): nodes share no health. A deployment failing
for every node is found failing by each within :data:`FAILURES_TO_COOL` calls.
"""

from __future__ import annotations

import math
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from gateway.accounts.catalog import Model
from gateway.config.settings import DeploymentConfig

#: a 429 without Retry-After cools its deployment this long
DEFAULT_RATE_LIMIT_COOLDOWN_S = 5.0
MIN_COOLDOWN_S = 1.0
MAX_COOLDOWN_S = 60.0
#: consecutive failures (other than a 429) that put a deployment to cool down
FAILURES_TO_COOL = 3
FAILURE_COOLDOWN_S = 10.0
#: the share of ``latency`` plans drawn at random, so that a slow deployment that got
#: better is measured again
EXPLORE = 0.1
#: the weight of a new time to first byte in its moving average
TTFB_SMOOTHING = 0.3
#: the window of a deployment's own rpm and tpm
LIMIT_WINDOW_S = 60.0


class RouteMetrics(Protocol):
    """The per-deployment series (:class:`gateway.observe.metrics.Metrics`)."""

    def deployment_attempt(self, model: str, provider: str, index: int, outcome: str) -> None: ...
    def deployment_cooldown(self, model: str, provider: str, index: int) -> None: ...
    def deployment_first_byte(
        self, model: str, provider: str, index: int, seconds: float
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class Route:
    """One deployment of one model, as an attempt uses it: ``model`` is priced for the
    calling key and names the deployment's provider and upstream id."""

    model: Model
    index: int
    deployment: DeploymentConfig

    @property
    def key(self) -> tuple[str, int]:
        return self.model.id, self.index


@dataclass
class _Health:
    """One deployment on this node."""

    in_flight: int = 0
    #: consecutive failures
    failures: int = 0
    cool_until: float = -math.inf
    last_failed: float = -math.inf
    #: moving average of the time to first byte (None: never measured)
    ttfb_s: float | None = None
    #: attempts started in the last minute: (when, tokens)
    recent: deque[tuple[float, int]] = field(default_factory=deque)


class Router:
    """Deployment choice and health for every model of this node."""

    def __init__(
        self,
        *,
        rng: random.Random | None = None,
        now: Callable[[], float] = time.monotonic,
        metrics: RouteMetrics | None = None,
    ) -> None:
        self.rng = rng or random.Random()
        self.now = now
        self.metrics = metrics
        self._health: dict[tuple[str, int], _Health] = {}

    def _of(self, key: tuple[str, int]) -> _Health:
        health = self._health.get(key)
        if health is None:
            health = self._health[key] = _Health()
        return health

    # -- choosing ----------------------------------------------------------------------------

    def plan(
        self, model: Model, open_: list[tuple[int, DeploymentConfig]], tokens: int
    ) -> list[Route]:
        """The routes of ``model`` in the order to try them (``open_``: the deployments
        that may serve the key, with their index; ``tokens``: the call's worst case)."""
        now = self.now()
        routes = [Route(model.on(d.provider, d.upstream_id), i, d) for i, d in open_]
        ready = [r for r in routes if self._ready(r, now, tokens)]
        if not ready:
            # every one cooling or over its limits: the least recently failed first
            return sorted(routes, key=lambda r: self._of(r.key).last_failed)
        return self._order(model.config.routing, ready)

    def cooling(self, route: Route) -> bool:
        return self._of(route.key).cool_until > self.now()

    def _ready(self, route: Route, now: float, tokens: int) -> bool:
        health = self._of(route.key)
        if health.cool_until > now:
            return False
        recent = health.recent
        while recent and recent[0][0] <= now - LIMIT_WINDOW_S:
            recent.popleft()
        rpm, tpm = route.deployment.rpm, route.deployment.tpm
        if rpm is not None and len(recent) >= rpm:
            return False
        return tpm is None or sum(t for _, t in recent) + tokens <= tpm

    def _order(self, strategy: str, routes: list[Route]) -> list[Route]:
        if strategy == "ordered":
            return sorted(routes, key=lambda r: r.index)
        if strategy == "least_busy":
            shuffled = self.rng.sample(routes, len(routes))
            return sorted(shuffled, key=lambda r: self._of(r.key).in_flight)
        if strategy == "latency":
            shuffled = self.rng.sample(routes, len(routes))
            if self.rng.random() < EXPLORE:
                return shuffled
            return sorted(shuffled, key=self._latency)
        return self._weighted(routes)

    def _latency(self, route: Route) -> float:
        measured = self._of(route.key).ttfb_s
        return -1.0 if measured is None else measured

    def _weighted(self, routes: list[Route]) -> list[Route]:
        """Drawn by weight without replacement: the first by weight, then the next among
        the rest."""
        left, order = list(routes), []
        while left:
            pick = self.rng.random() * sum(r.deployment.weight for r in left)
            for route in left:
                pick -= route.deployment.weight
                if pick < 0:
                    break
            left.remove(route)
            order.append(route)
        return order

    # -- what attempts tell it ---------------------------------------------------------------

    def started(self, route: Route, tokens: int) -> None:
        health = self._of(route.key)
        health.in_flight += 1
        health.recent.append((self.now(), tokens))

    def ended(self, route: Route) -> None:
        self._of(route.key).in_flight -= 1

    def first_byte(self, route: Route, seconds: float) -> None:
        """The deployment's first byte came after ``seconds``: it is healthy."""
        health = self._of(route.key)
        health.failures = 0
        previous = health.ttfb_s
        health.ttfb_s = (
            seconds if previous is None else previous + TTFB_SMOOTHING * (seconds - previous)
        )
        if self.metrics is not None:
            provider, model = route.deployment.provider, route.model.id
            self.metrics.deployment_first_byte(model, provider, route.index, seconds)

    def outcome(self, route: Route, outcome: str) -> None:
        """An attempt ended: ``ok`` or the reason it failed (the metric only)."""
        if self.metrics is not None:
            provider, model = route.deployment.provider, route.model.id
            self.metrics.deployment_attempt(model, provider, route.index, outcome)

    def failed(self, route: Route, reason: str, retry_after: float | None = None) -> None:
        """The attempt failed before its first byte for ``reason``
        (:func:`gateway.calls.provider_errors.retry_reason`); the deployment may cool down."""
        now = self.now()
        health = self._of(route.key)
        health.failures += 1
        health.last_failed = now
        self.outcome(route, reason)
        cooldown = 0.0
        if reason == "rate_limited":
            wanted = DEFAULT_RATE_LIMIT_COOLDOWN_S if retry_after is None else retry_after
            cooldown = min(MAX_COOLDOWN_S, max(MIN_COOLDOWN_S, wanted))
        elif reason == "credential":
            cooldown = MAX_COOLDOWN_S
        elif health.failures >= FAILURES_TO_COOL:
            doubled = FAILURE_COOLDOWN_S * 2 ** min(health.failures - FAILURES_TO_COOL, 8)
            cooldown = min(MAX_COOLDOWN_S, doubled)
        if cooldown:
            health.cool_until = max(health.cool_until, now + cooldown)
            if self.metrics is not None:
                provider, model = route.deployment.provider, route.model.id
                self.metrics.deployment_cooldown(model, provider, route.index)
