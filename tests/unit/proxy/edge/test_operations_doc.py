"""docs/operations.md lists every proxy setting, its plugins' too (a new setting without a line
there fails)."""

from __future__ import annotations

from talaria.proxy.edge.settings import setting_names
from tests.support import REPO_ROOT

DOC = REPO_ROOT / "docs" / "operations.md"


def test_every_setting_is_documented() -> None:
    text = DOC.read_text()
    missing = [n for n in setting_names() if f"| `TALARIA_{n.upper()}` |" not in text]
    assert missing == []


def test_the_plugins_settings_are_read() -> None:
    names = setting_names()
    assert {"placement_library", "store_responses", "responses_ttl_s"} <= set(names)
    assert len(names) == len(set(names))  # no plugin declares a setting twice
