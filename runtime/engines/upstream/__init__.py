"""The upstream engine (``engine = "openai"``): a model served by an OpenAI-compatible server
that runs on its own — ``vllm serve``, SGLang, llama.cpp's server — reached over HTTP
(client.py, every read bounded: reading.py), switched in and out through the server's own sleep
endpoints (sleep.py), behind the ``Engine`` seam (engine.py), each call run by generation.py
(its output cut at its limit, its usage checked: usage.py); options.py checks its
``[[model]]`` options. docs/upstream.md
is the operator's guide."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from talaria.core.clock import Clock
from talaria.runtime.engines.upstream.client import UpstreamClient, chat_body
from talaria.runtime.engines.upstream.engine import UpstreamEngine
from talaria.runtime.engines.upstream.options import (
    UPSTREAM_RATES,
    UpstreamOptions,
    normalise_url,
    upstream_options,
)
from talaria.runtime.engines.upstream.reading import UpstreamBoundExceeded, UpstreamUnavailable

__all__ = [
    "UPSTREAM_RATES",
    "UpstreamBoundExceeded",
    "UpstreamClient",
    "UpstreamEngine",
    "UpstreamOptions",
    "UpstreamUnavailable",
    "build_upstream_engine",
    "chat_body",
    "normalise_url",
    "upstream_options",
]


def build_upstream_engine(
    name: str, options: Mapping[str, Any], clock: Clock, node: str
) -> UpstreamEngine:
    """The engine of model ``name`` from its ``[[model]]`` options (``NodeConfigError`` for a
    bad one)."""
    return UpstreamEngine(name, upstream_options(name, options), clock, node)
