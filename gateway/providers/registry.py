"""Providers by name, built from the configuration."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from gateway.config.settings import Config, ProviderConfig
from gateway.providers.anthropic import AnthropicProvider
from gateway.providers.azure import AzureProvider
from gateway.providers.base import Provider
from gateway.providers.gemini import GeminiProvider
from gateway.providers.mock import MockProvider
from gateway.providers.openai import OpenAIProvider


def _bedrock(config: ProviderConfig, secrets: Callable[[], Iterable[str]]) -> Provider:
    """The bedrock kind, imported once a bedrock provider is configured: its signing and
    event stream come from botocore, ~50 ms of every start otherwise."""
    from gateway.providers.bedrock import BedrockProvider

    return BedrockProvider(config, secrets)


#: what builds each kind that speaks HTTP, one entry per kind
HTTP_KINDS: dict[str, Callable[[ProviderConfig, Callable[[], Iterable[str]]], Provider]] = {
    "openai": OpenAIProvider,
    "anthropic": AnthropicProvider,
    "gemini": GeminiProvider,
    "azure": AzureProvider,
    "bedrock": _bedrock,
}


def build_providers(
    config: Config, mock: MockProvider, secrets: Callable[[], Iterable[str]] = tuple
) -> dict[str, Provider]:
    """One provider object per configured provider; kind mock shares the one mock.
    ``secrets`` gives the credentials to cut out of upstream error text."""
    providers: dict[str, Provider] = {}
    for provider in config.providers:
        if provider.kind == "mock":
            providers[provider.name] = mock
        else:
            providers[provider.name] = HTTP_KINDS[provider.kind](provider, secrets)
    return providers


def live_on_mock_message(model_id: str) -> str:
    """The refusal of a live key's call to a model only the mock serves: the mock serves
    sandbox keys, never live ones (they are billed), so the operator must configure a
    real provider for the model, or the caller use a sandbox key."""
    return (
        f"{model_id} is served only by the mock provider, which serves sandbox keys"
        " (svc_test_...), never live ones. Use a sandbox key, or have the operator configure"
        f" a real provider for {model_id}: a [[providers]] table (kind openai, anthropic,"
        " gemini, bedrock or azure) named by the model's provider key (docs/CONFIG.md)."
    )
