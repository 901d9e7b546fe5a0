"""The catalog's error (``CatalogError``), in a module of its own so that both that raise it
share it without a cycle: the loader (core/catalog.py) and a server's look-ups of the figures
its file gives (core/server_spec.py), which the loader imports."""


class CatalogError(ValueError):
    """A catalog file is missing a field, has a wrong type, or names an unknown entry."""
