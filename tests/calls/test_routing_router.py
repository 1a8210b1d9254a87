"""The router alone (gateway/calls/routing.py): strategies with an injected random
source and clock, cooldowns and their bounds, per-deployment rpm/tpm, and never a plan
without a deployment."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest

from gateway.accounts.catalog import Model
from gateway.calls.routing import (
    FAILURE_COOLDOWN_S,
    FAILURES_TO_COOL,
    LIMIT_WINDOW_S,
    MAX_COOLDOWN_S,
    MIN_COOLDOWN_S,
    Route,
    Router,
)
from gateway.config.settings import DeploymentConfig, ModelConfig


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def model(routing: str = "weighted", *deployments: DeploymentConfig) -> Model:
    listed = deployments or (DeploymentConfig("a", "up-a"), DeploymentConfig("b", "up-b"))
    config = ModelConfig("m", listed[0].provider, listed[0].upstream_id)
    return Model(replace(config, deployments=listed, routing=routing))


def every(m: Model) -> list[tuple[int, DeploymentConfig]]:
    return list(enumerate(m.config.routes()))


def firsts(router: Router, m: Model, n: int, tokens: int = 1) -> Counter[str]:
    return Counter(router.plan(m, every(m), tokens)[0].deployment.provider for _ in range(n))


def test_the_single_upstream_form_is_one_deployment() -> None:
    config = ModelConfig("m", "p", "up")
    assert config.routes() == (DeploymentConfig("p", "up"),)


def test_weighted_draws_by_weight_and_lists_every_deployment() -> None:
    router = Router(rng=random.Random(7))
    m = model("weighted", DeploymentConfig("a", "x", 3.0), DeploymentConfig("b", "y", 1.0))
    counts = firsts(router, m, 4000)
    assert 2850 <= counts["a"] <= 3150, counts
    plan = router.plan(m, every(m), 1)
    assert sorted(r.deployment.provider for r in plan) == ["a", "b"]


def test_ordered_keeps_the_configured_order() -> None:
    router = Router(rng=random.Random(1))
    m = model("ordered")
    assert [r.index for r in router.plan(m, every(m), 1)] == [0, 1]


def test_least_busy_prefers_fewer_in_flight() -> None:
    router = Router(rng=random.Random(1))
    m = model("least_busy")
    busy = router.plan(m, every(m), 1)[0]
    router.started(busy, 1)
    assert router.plan(m, every(m), 1)[0].index != busy.index
    router.ended(busy)


def test_latency_prefers_the_fastest_and_explores() -> None:
    router = Router(rng=random.Random(3))
    m = model("latency")
    slow, fast = router.plan(m, every(m), 1)
    router.first_byte(slow, 2.0)
    router.first_byte(fast, 0.1)
    counts = firsts(router, m, 1000)
    fastest = fast.deployment.provider
    assert counts[fastest] > 900  # the fastest, but for exploration
    assert counts[slow.deployment.provider] > 0


def ordered_first(clock: Clock) -> tuple[Router, Route]:
    """A router on ``clock`` and the first route of an ordered model of two."""
    router = Router(rng=random.Random(1), now=clock)
    m = model("ordered")
    return router, router.plan(m, every(m), 1)[0]


def test_a_429_cools_for_its_retry_after_bounded() -> None:
    clock = Clock()
    router, first = ordered_first(clock)
    m = first.model
    router.failed(first, "rate_limited", retry_after=30)
    assert [r.index for r in router.plan(m, every(m), 1)] == [1]
    clock.t += 29.9
    assert [r.index for r in router.plan(m, every(m), 1)] == [1]
    clock.t += 0.2
    assert [r.index for r in router.plan(m, every(m), 1)] == [0, 1]
    router.failed(first, "rate_limited", retry_after=100_000)
    clock.t += MAX_COOLDOWN_S + 0.1
    assert router.plan(m, every(m), 1)[0].index == 0  # bounded
    router.failed(first, "rate_limited", retry_after=0)
    assert router.cooling(first)
    clock.t += MIN_COOLDOWN_S + 0.1
    assert not router.cooling(first)


def test_consecutive_failures_cool_a_deployment_and_a_success_resets_them() -> None:
    clock = Clock()
    router, first = ordered_first(clock)
    for _ in range(FAILURES_TO_COOL - 1):
        router.failed(first, "server_error")
    assert not router.cooling(first)
    router.first_byte(first, 0.1)  # healthy again: the count starts over
    for _ in range(FAILURES_TO_COOL - 1):
        router.failed(first, "server_error")
    assert not router.cooling(first)
    router.failed(first, "server_error")
    assert router.cooling(first)
    clock.t += FAILURE_COOLDOWN_S + 0.1
    assert not router.cooling(first)


def test_every_deployment_cooling_still_gives_a_plan_least_recently_failed_first() -> None:
    clock = Clock()
    router = Router(rng=random.Random(1), now=clock)
    m = model("ordered")
    a, b = router.plan(m, every(m), 1)
    router.failed(b, "credential")
    clock.t += 1
    router.failed(a, "credential")
    assert [r.index for r in router.plan(m, every(m), 1)] == [b.index, a.index]


@pytest.mark.parametrize(("limits", "tokens"), [({"rpm": 2}, 1), ({"tpm": 100}, 40)])
def test_a_deployment_over_its_own_limits_is_skipped_per_node(
    limits: dict[str, int], tokens: int
) -> None:
    clock = Clock()
    router = Router(rng=random.Random(1), now=clock)
    m = model("ordered", DeploymentConfig("a", "x", **limits), DeploymentConfig("b", "y"))
    for _ in range(2):
        route = router.plan(m, every(m), tokens)[0]
        assert route.index == 0
        router.started(route, tokens)
        router.ended(route)
    assert router.plan(m, every(m), tokens)[0].index == 1
    clock.t += LIMIT_WINDOW_S + 0.1
    assert router.plan(m, every(m), tokens)[0].index == 0


def test_only_the_open_deployments_are_planned() -> None:
    router = Router(rng=random.Random(1))
    m = model("weighted")
    only_b = [(1, m.config.routes()[1])]
    for _ in range(20):
        assert [r.deployment.provider for r in router.plan(m, only_b, 1)] == ["b"]
