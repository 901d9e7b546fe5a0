"""Alembic migrations of the session store (``talaria.migrations``); run them with
``talaria db upgrade`` or ``talaria.proxy.store.migrate``."""
