"""Model providers: the interface (:mod:`.base`) and its implementations.

This package is the only place that talks to model upstreams; the gateway sees
providers only through :class:`Provider` and the :class:`ProviderError` tree.
"""

from gateway.providers.base import (
    EmbeddingResult,
    Provider,
    ProviderDropped,
    ProviderError,
    ProviderMalformed,
    ProviderRateLimited,
    ProviderRefused,
    ProviderRequest,
    ProviderResult,
    ProviderServerError,
    ProviderTimedOut,
    ProviderUnreachable,
    Usage,
    embedding_response,
)
from gateway.providers.mock import MockProvider

__all__ = [
    "EmbeddingResult",
    "MockProvider",
    "Provider",
    "ProviderDropped",
    "ProviderError",
    "ProviderMalformed",
    "ProviderRateLimited",
    "ProviderRefused",
    "ProviderRequest",
    "ProviderResult",
    "ProviderServerError",
    "ProviderTimedOut",
    "ProviderUnreachable",
    "Usage",
    "embedding_response",
]
