"""docs/operations.md lists every proxy setting (a new setting without a line there fails)."""

from __future__ import annotations

from pathlib import Path

from talaria.proxy.contract.settings import ProxySettings

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def test_every_setting_is_documented() -> None:
    text = DOC.read_text()
    missing = [n for n in ProxySettings.model_fields if f"| `TALARIA_{n.upper()}` |" not in text]
    assert missing == []
