"""Model providers: the interface (:mod:`.base`) and its implementations.

This package is the only place that talks to model upstreams; the gateway sees
providers only through :class:`~gateway.providers.base.Provider` and the
:class:`~gateway.providers.base.ProviderError` tree. Import them from the module
that defines them (:mod:`.base`, :mod:`.mock`, :mod:`.openai`, built by :mod:`.registry`).
"""
