"""The API dialects the proxy serves: one line each (proxy/dialects/__init__.py says how to
add one)."""

from __future__ import annotations

from talaria.proxy.dialects.anthropic.routes import DIALECT as ANTHROPIC
from talaria.proxy.dialects.base import Dialect
from talaria.proxy.dialects.chat.routes import DIALECT as CHAT
from talaria.proxy.dialects.completions.routes import DIALECT as COMPLETIONS
from talaria.proxy.dialects.responses.routes import DIALECT as RESPONSES

DIALECTS: tuple[Dialect, ...] = (CHAT, COMPLETIONS, ANTHROPIC, RESPONSES)
