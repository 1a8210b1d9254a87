"""The model catalog: models of the configuration, their capabilities and prices."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from gateway.config.settings import Config, ModelConfig
from shards import NANOS_PER_USD

__all__ = [
    "NANOS_PER_USD",
    "Catalog",
    "Model",
    "nanos_to_usd",
    "provider_agrees",
    "usd_to_nanos",
]

CATALOG_CREATED = 1_700_000_000  # a fixed 'created' stamp: the catalog has no history


#: prices are counted in integer units of 1e-12 USD per million tokens
_PRICE_UNITS = 10**12
#: nano-USD = tokens x USD per Mtok x 1000 = tokens x units / (_PRICE_UNITS / 1000)
_UNITS_PER_NANO = _PRICE_UNITS // 1000


@functools.lru_cache(maxsize=4096)
def _units(usd_per_mtok: float) -> int:
    """A price in integer units of 1e-12 USD per Mtok, from the decimal the operator
    wrote (a float's shortest repr gives it back: 0.3, not 0.299999...), rounded up.

    Why integers: a float sum of tokens times prices such as 0.3 lands just above a
    whole nano-USD in about one case in ten and the ceiling then bills one nano more
    than the price says; in integers the cost is exact."""
    return math.ceil(Fraction(repr(float(usd_per_mtok))) * _PRICE_UNITS)


def usd_to_nanos(usd: float) -> int:
    return round(usd * NANOS_PER_USD)


def nanos_to_usd(nanos: int) -> float:
    return round(nanos / NANOS_PER_USD, 9)


@dataclass(frozen=True, slots=True)
class Model:
    config: ModelConfig

    @property
    def id(self) -> str:
        return self.config.id

    @property
    def kind(self) -> str:
        return self.config.kind

    @property
    def priced(self) -> bool:
        return self.config.input_usd_per_mtok is not None and (
            self.config.output_usd_per_mtok is not None
        )

    def priced_at(
        self,
        input_usd_per_mtok: float,
        output_usd_per_mtok: float,
        cache_read_usd_per_mtok: float | None = None,
        cache_write_usd_per_mtok: float | None = None,
    ) -> Model:
        """This model at another price (an organisation's BYOK price). Its cache prices
        are the ones given, the catalog's never: absent, cached tokens cost the new input
        price."""
        return Model(
            replace(
                self.config,
                input_usd_per_mtok=float(input_usd_per_mtok),
                output_usd_per_mtok=float(output_usd_per_mtok),
                cache_read_usd_per_mtok=_price_or_none(cache_read_usd_per_mtok),
                cache_write_usd_per_mtok=_price_or_none(cache_write_usd_per_mtok),
            )
        )

    def on(self, provider: str, upstream_id: str) -> Model:
        """This model, at its price, served by one of its deployments: the provider and
        upstream id an attempt uses, records and bills."""
        if (provider, upstream_id) == (self.config.provider, self.config.upstream_id):
            return self
        return Model(replace(self.config, provider=provider, upstream_id=upstream_id))

    def has(self, capability: str) -> bool:
        return capability in self.config.capabilities

    def cost_nanos(
        self,
        input_tokens: int,
        output_tokens: int,
        cached_tokens: int = 0,
        cache_write_tokens: int = 0,
    ) -> int:
        """Cost in nano-USD, rounded up so a reservation never falls short.

        ``input_tokens`` counts every input token; ``cached_tokens`` (read from the
        provider's prompt cache) and ``cache_write_tokens`` (written to it) are parts of
        it, priced at the cache prices (absent: the input price), the rest at the input
        price. A report that does not add up (parts above the whole, from a faulty
        upstream) is clamped: the parts never exceed the input, the cached part first,
        and a negative count is 0, so what is billed never depends on numbers that
        cannot be.
        """
        cfg = self.config
        in_price = _units(cfg.input_usd_per_mtok or 0.0)
        read = cfg.cache_read_usd_per_mtok
        write = cfg.cache_write_usd_per_mtok
        prompt = max(0, input_tokens)
        cached = min(max(0, cached_tokens), prompt)
        written = min(max(0, cache_write_tokens), prompt - cached)
        units = (
            (prompt - cached - written) * in_price
            + cached * (in_price if read is None else _units(read))
            + written * (in_price if write is None else _units(write))
            + max(0, output_tokens) * _units(cfg.output_usd_per_mtok or 0.0)
        )
        return -(-units // _UNITS_PER_NANO)  # rounded up

    def public(self) -> dict[str, Any]:
        cfg = self.config
        return {
            "id": cfg.id,
            "object": "model",
            "created": CATALOG_CREATED,
            "owned_by": cfg.provider,
            "kind": cfg.kind,
            "capabilities": {cap: cap in cfg.capabilities for cap in _CAPS},
            "tools": "tools" in cfg.capabilities,
            "structured_output": "structured_output" in cfg.capabilities,
            "vision": "vision" in cfg.capabilities,
            "web_search": "web_search" in cfg.capabilities,
            "zero_retention_available": cfg.zero_retention_available,
            "byok_available": cfg.byok_available,
            "pricing": {
                "input_usd_per_mtok": cfg.input_usd_per_mtok,
                "output_usd_per_mtok": cfg.output_usd_per_mtok,
                # None: cached input is priced as input
                "cache_read_usd_per_mtok": cfg.cache_read_usd_per_mtok,
                "cache_write_usd_per_mtok": cfg.cache_write_usd_per_mtok,
            },
        }


_CAPS = ("tools", "structured_output", "vision", "web_search")


def _price_or_none(price: float | None) -> float | None:
    return None if price is None else float(price)


def _zero_retention_as_served(config: Config, model: ModelConfig) -> ModelConfig:
    """A model serves zero-retention keys only if a provider of its deployments has a
    zero-retention agreement too (``[[providers]] zero_retention``): the model's flag
    alone would send such a key's content to a provider that keeps it. Such a key is
    routed only over the deployments of those providers
    (:func:`gateway.calls.policy.open_deployments`)."""
    if not model.zero_retention_available:
        return model
    agreed = any(provider_agrees(config, d.provider) for d in model.routes())
    return model if agreed else replace(model, zero_retention_available=False)


def provider_agrees(config: Config, provider: str) -> bool:
    """The provider has a zero-retention agreement."""
    try:
        return config.provider(provider).zero_retention
    except KeyError:  # config validation names every model's provider; be safe anyway
        return False


class Catalog:
    """The configured models: the enabled ones serve, a disabled one answers 503
    model_unavailable (it exists, it is off for now), and aliases name models too."""

    def __init__(self, config: Config) -> None:
        served = [_zero_retention_as_served(config, m) for m in config.models]
        self._every: dict[str, Model] = {m.id: Model(m) for m in served}
        self.models: dict[str, Model] = {m.id: Model(m) for m in served if m.enabled}
        self._aliases: dict[str, list[str]] = {}
        for model in config.models:
            for alias in model.aliases:
                self._aliases.setdefault(alias, []).append(model.id)

    def get(self, model_id: str) -> Model | None:
        return self.models.get(model_id)

    def every(self) -> list[Model]:
        """Every configured model, enabled or not, in configuration order."""
        return list(self._every.values())

    def candidates(self, name: str) -> list[str]:
        """The ids a requested name may mean: the model itself, else every model it aliases."""
        if name in self._every:
            return [name]
        return list(self._aliases.get(name, ()))

    def is_disabled(self, model_id: str) -> bool:
        return model_id in self._every and model_id not in self.models

    def set_enabled(self, model_id: str, enabled: bool) -> Model | None:
        """Turn a configured model on or off (the caller stores the switch); None if unknown."""
        model = self._every.get(model_id)
        if model is None:
            return None
        on = {i for i in self.models if i != model_id} | ({model_id} if enabled else set())
        self.models = {i: m for i, m in self._every.items() if i in on}  # config order
        return model

    def embedding_model(self) -> Model | None:
        return next((m for m in self.models.values() if m.kind == "embedding"), None)

    def listing(self, models: list[Model] | None = None) -> dict[str, Any]:
        chosen = list(self.models.values()) if models is None else models
        return {"object": "list", "data": [m.public() for m in chosen]}
