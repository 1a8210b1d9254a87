"""Local fake upstreams: real HTTP servers on loopback that answer as OpenAI (and any
OpenAI-compatible API), Anthropic, Gemini, Bedrock and Azure OpenAI do — their shapes,
streams and usage, and refusals of what the real APIs refuse — with no network and no
cost. ``svc-gateway fake-upstream`` runs one to try a configuration for free
(:mod:`gateway.fakes.local_fake`); the tests run them inside their trio loop.

Every answer is a few words; faults are chosen per request by a directive in the
prompt (``[[fault status=500]]`` and the others listed in :mod:`.fake_upstream`).
"""
