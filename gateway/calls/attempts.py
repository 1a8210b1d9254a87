"""A call's attempts over deployments and fallback models, before the first byte.

    plan: the model's open deployments, ordered by its strategy (routing.py)
          then each fallback model the key could call itself, reserved for (pipeline.py)
    for each route, at most max_attempts:
        ask it; an attempt but the last is given up past first_byte_timeout_s
        a first byte        → the call is this attempt's from now on (never retried)
        a retryable failure → the deployment's health is told, the next route is tried
        another failure     → the call fails with it (the spec's table on it)
    every route failed      → the call fails with the last failure

What is retried is :func:`gateway.calls.provider_errors.retry_reason`'s; the decisions are
in docs/decisions/routing.md. A non-streamed attempt's "first byte" is its whole answer
(the gateway does not stream it internally): every attempt but the last must answer
within ``first_byte_timeout_s``, the last has what is left of the call's time.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import trio

from gateway.accounts.catalog import Model
from gateway.calls.lifecycle import Call
from gateway.calls.policy import open_deployments
from gateway.calls.provider_errors import map_provider_error, retry_reason
from gateway.calls.routing import Route
from gateway.providers.base import (
    ProviderError,
    ProviderRateLimited,
    ProviderRefused,
    ProviderServerError,
    ProviderTimedOut,
)

T = TypeVar("T")

#: a fallback model, checked for the key and reserved for, or None: it may not serve
Fallback = Callable[[str], Awaitable[Model | None]]


@dataclass(frozen=True, slots=True)
class Attempts:
    """The routes of one call: its model (priced for the key), the worst-case tokens
    (for the deployments' tpm), how a fallback is checked and reserved for."""

    call: Call
    model: Model
    tokens: int
    fallback: Fallback

    def first_byte_timeout(self, model: Model) -> float:
        """The attempt's model's ``first_byte_timeout_s`` (a fallback's own: it may be
        slower to start than the model asked for), by default the call's time limit /
        the requested model's ``max_attempts`` (the attempts' budget)."""
        if model.config.first_byte_timeout_s is not None:
            return model.config.first_byte_timeout_s
        return self.call.parts.request_timeout_s / self.model.config.max_attempts

    def _routes(self, model: Model) -> list[Route]:
        call = self.call
        open_ = open_deployments(call.parts.policy, call.record, model)
        return call.parts.router.plan(model, open_, self.tokens)

    async def run(self, ask: Callable[[Route], Awaitable[T]]) -> T:
        """``ask`` the routes in turn until one gives its first byte (``ask`` returns);
        the last failure is raised when none did. The call holds the served route."""
        call, router = self.call, self.call.parts.router
        limit = self.model.config.max_attempts
        routes = self._routes(self.model)  # not empty: the walk checked (check_routes)
        fallbacks = list(self.model.config.fallbacks)
        count = 0
        while True:
            route = routes.pop(0)
            count += 1
            final = count >= limit or (not routes and not fallbacks)
            try:
                return await self._attempt(route, ask, final)
            except ProviderError as exc:
                reason = retry_reason(exc, byok=call.record.byok)
                error, _ = map_provider_error(exc, byok=call.record.byok)
                if reason is None:
                    router.outcome(route, "other")  # the request's fault, not the deployment's
                else:
                    retry_after = exc.retry_after if isinstance(exc, ProviderRateLimited) else None
                    router.failed(route, reason, retry_after)
                if final or reason is None or call.remaining() <= 0:
                    call.note_failure(_status(exc), error.code)
                    raise
                call.attempt_failed(_status(exc), error.code)
                while not routes and fallbacks:
                    fallback = await self.fallback(fallbacks.pop(0))
                    if fallback is not None:
                        routes = self._routes(fallback)
                if not routes:
                    raise

    async def _attempt(self, route: Route, ask: Callable[[Route], Awaitable[T]], final: bool) -> T:
        call, router = self.call, self.call.parts.router
        router.started(route, self.tokens)  # before any checkpoint: the next plan sees it
        try:
            await call.start_attempt(route)
            if final:  # no timeout of its own: no scope (~50 function calls)
                result = await ask(route)
            else:
                with trio.move_on_after(self.first_byte_timeout(route.model)) as scope:
                    result = await ask(route)
                if scope.cancelled_caught:
                    raise ProviderTimedOut("no first byte within first_byte_timeout_s")
        finally:
            router.ended(route)
        router.first_byte(route, call.first_byte())
        router.outcome(route, "ok")
        return result


def _status(exc: ProviderError) -> int | None:
    """The upstream's HTTP status of a failure (None: there was no answer)."""
    if isinstance(exc, ProviderRateLimited):
        return 429
    if isinstance(exc, (ProviderServerError, ProviderRefused)):
        return exc.status
    return None
