"""svc-gateway: a key-authenticated gateway for language-model calls, on trio."""

__version__ = "0.1.0"
