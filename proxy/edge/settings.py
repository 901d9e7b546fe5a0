"""Every setting the proxy reads: its own (``ProxySettings``) and its plugins', each declared
beside its plugin (proxy/contract/settings.py ``PluginSettings``): placement's, and those of
the dialects that declare any (``Dialect.settings``)."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic_settings import BaseSettings

from talaria.proxy.contract.settings import PluginSettings, ProxySettings
from talaria.proxy.dialects.base import Dialect
from talaria.proxy.dialects.registry import DIALECTS
from talaria.proxy.placement.settings import PlacementSettings


def plugin_settings(dialects: Sequence[Dialect] = DIALECTS) -> tuple[type[PluginSettings], ...]:
    """The plugins' settings: placement's, then each dialect's that declares some."""
    declared = (d.settings for d in dialects if d.settings is not None)
    return (PlacementSettings, *declared)


def check_settings(settings: ProxySettings, dialects: Sequence[Dialect] = DIALECTS) -> None:
    """Read every plugin's settings of ``settings`` once: pydantic's ``ValidationError`` (a
    ``ValueError``) for a bad one, with the message the proxy's own settings give."""
    for kind in plugin_settings(dialects):
        kind.of(settings)


def setting_names(dialects: Sequence[Dialect] = DIALECTS) -> list[str]:
    """The field of every setting (``TALARIA_<FIELD>``), the proxy's first."""
    kinds: tuple[type[BaseSettings], ...] = (ProxySettings, *plugin_settings(dialects))
    return [name for kind in kinds for name in kind.model_fields]
