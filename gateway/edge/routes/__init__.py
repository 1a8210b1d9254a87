"""HTTP routes, one module per resource; each exposes ``register(app)``."""
