"""The one error the store raises to the code above it, whichever the backend."""


class StoreError(Exception):
    """The database cannot be used (missing, not a database, unreachable, locked...)."""
