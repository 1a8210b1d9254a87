"""The model catalog: models of the configuration, their capabilities and prices."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from gateway.config.settings import Config, ModelConfig
from shards import NANOS_PER_USD

__all__ = ["NANOS_PER_USD", "Catalog", "Model", "nanos_to_usd", "usd_to_nanos"]

CATALOG_CREATED = 1_700_000_000  # a fixed 'created' stamp: the catalog has no history


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

    def priced_at(self, input_usd_per_mtok: float, output_usd_per_mtok: float) -> Model:
        """This model at another price (an organisation's BYOK price)."""
        return Model(
            replace(
                self.config,
                input_usd_per_mtok=float(input_usd_per_mtok),
                output_usd_per_mtok=float(output_usd_per_mtok),
            )
        )

    def has(self, capability: str) -> bool:
        return capability in self.config.capabilities

    def cost_nanos(self, input_tokens: int, output_tokens: int) -> int:
        """Cost in nano-USD, rounded up so a reservation never falls short."""
        in_price = self.config.input_usd_per_mtok or 0.0
        out_price = self.config.output_usd_per_mtok or 0.0
        # USD per Mtok == nano-USD per 1000 tokens
        return math.ceil((input_tokens * in_price + output_tokens * out_price) * 1000)

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
            },
        }


_CAPS = ("tools", "structured_output", "vision", "web_search")


def _zero_retention_as_served(config: Config, model: ModelConfig) -> ModelConfig:
    """A model serves zero-retention keys only if its provider has a zero-retention
    agreement too (``[[providers]] zero_retention``): the model's flag alone would send
    such a key's content to a provider that keeps it."""
    if not model.zero_retention_available:
        return model
    try:
        agreed = config.provider(model.provider).zero_retention
    except KeyError:  # config validation names every model's provider; be safe anyway
        agreed = False
    return model if agreed else replace(model, zero_retention_available=False)


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
