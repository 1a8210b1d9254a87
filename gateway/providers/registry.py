"""Providers by name, built from the configuration."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from gateway.config.settings import Config, ProviderConfig
from gateway.providers.anthropic import AnthropicProvider
from gateway.providers.azure import AzureProvider
from gateway.providers.base import Provider
from gateway.providers.bedrock import BedrockProvider
from gateway.providers.gemini import GeminiProvider
from gateway.providers.mock import MockProvider
from gateway.providers.openai import OpenAIProvider

#: the class of each kind that speaks HTTP, one entry per kind
HTTP_KINDS: dict[str, Callable[[ProviderConfig, Callable[[], Iterable[str]]], Provider]] = {
    "openai": OpenAIProvider,
    "anthropic": AnthropicProvider,
    "gemini": GeminiProvider,
    "azure": AzureProvider,
    "bedrock": BedrockProvider,
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
