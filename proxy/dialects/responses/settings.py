"""The Responses dialect's settings (its stored responses: store.py, quota.py), beside it:
``TALARIA_STORE_RESPONSES`` and ``TALARIA_RESPONSES_*``, or the arguments given to
``ProxySettings``; read with ``ResponsesSettings.of(settings)`` (proxy/contract/settings.py
``PluginSettings``)."""

from __future__ import annotations

from pydantic import Field

from talaria.proxy.contract.settings import PluginSettings


class ResponsesSettings(PluginSettings):
    """Whether Responses API objects are stored, for how long, and their quotas."""

    store_responses: bool = Field(
        True, description="Keep Responses API objects for previous_response_id (false: never)"
    )
    responses_ttl_s: float = Field(7 * 24 * 3600.0, gt=0, description="How long they are kept")
    responses_tenant_quota_bytes: int = Field(
        256 * 2**20,
        gt=0,
        description="Bytes one tenant's stored responses may take; a store: true call past "
        "it gets 429 (docs/operations.md, Bounds, quotas and timeouts)",
    )
    responses_max_bytes: int = Field(
        4 * 2**30,
        gt=0,
        description="Bytes all stored responses may take; a store: true call past it gets 429",
    )
