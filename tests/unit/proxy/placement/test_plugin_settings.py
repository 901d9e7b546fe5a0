"""A plugin's settings live beside it (proxy/contract/settings.py ``PluginSettings``):
placement's (proxy/placement/settings.py) and the Responses dialect's
(proxy/dialects/responses/settings.py) are read from the same ``TALARIA_*`` variables and
arguments as when they were the proxy's own fields, with the same defaults."""

from __future__ import annotations

import pytest

from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.dialects.responses.settings import ResponsesSettings
from talaria.proxy.placement.settings import PlacementSettings


@pytest.fixture(autouse=True)
def _no_talaria_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TALARIA_STORE_RESPONSES", "TALARIA_PLACEMENT_LIBRARY"):
        monkeypatch.delenv(name, raising=False)


def test_the_defaults_are_the_proxys_former_ones() -> None:
    responses = ResponsesSettings.of(ProxySettings())
    assert (responses.store_responses, responses.responses_ttl_s) == (True, 7 * 24 * 3600.0)
    assert responses.responses_tenant_quota_bytes == 256 * 2**20
    assert responses.responses_max_bytes == 4 * 2**30
    placement = PlacementSettings.of(ProxySettings())
    assert placement.placement_library is None
    config = placement.config()
    assert (config.interval_s, config.window_s, config.min_hold_s, config.drain_s) == (
        60.0,
        300.0,
        900.0,
        600.0,
    )
    assert placement.placement_cold_start_timeout_s == 900.0


def test_arguments_to_the_proxys_settings_reach_the_plugins() -> None:
    settings = ProxySettings(store_responses=False, placement_library="lib.toml")
    assert ResponsesSettings.of(settings).store_responses is False
    assert PlacementSettings.of(settings).placement_library == "lib.toml"
    copied = settings.model_copy(update={"runtimes": ["http://r"]})  # talaria serve --model
    assert PlacementSettings.of(copied).placement_library == "lib.toml"


def test_variables_reach_the_plugins_and_arguments_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TALARIA_STORE_RESPONSES", "false")
    monkeypatch.setenv("TALARIA_PLACEMENT_INTERVAL_S", "5")
    assert ResponsesSettings.of(ProxySettings()).store_responses is False
    assert PlacementSettings.of(ProxySettings()).placement_interval_s == 5.0
    given = ProxySettings(placement_interval_s=7.0)
    assert PlacementSettings.of(given).placement_interval_s == 7.0


def test_a_bad_value_reads_as_the_proxys_own_without_its_input() -> None:
    with pytest.raises(ValueError) as refused:
        ResponsesSettings.of(ProxySettings(responses_max_bytes="secret-ish"))
    text = str(refused.value)
    assert text.startswith("1 validation error for ProxySettings\nresponses_max_bytes\n")
    assert "secret-ish" not in text
