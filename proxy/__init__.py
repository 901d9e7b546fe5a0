"""The OpenAI-compatible session gateway: API, session store, routing, admin.

Its rooms, lowest first (each may import only the rooms before it; docs/architecture.md,
"Rooms", and tests/unit/test_layering.py): contract/, store/, sessions/, runtimes/, cluster/,
placement/, callpath/, dialects/, console/, api/, edge/. The package's face is
:func:`create_app` and :class:`ProxySettings`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from talaria.proxy.contract.settings import ProxySettings
    from talaria.proxy.edge.app import create_app

__all__ = ["ProxySettings", "create_app"]


def __getattr__(name: str) -> Any:
    """The face, imported when first used (the rooms are not loaded by ``import
    talaria.proxy``)."""
    if name == "create_app":
        from talaria.proxy.edge.app import create_app

        return create_app
    if name == "ProxySettings":
        from talaria.proxy.contract.settings import ProxySettings

        return ProxySettings
    raise AttributeError(name)
