"""``talaria serve --upstream URL``: front OpenAI-compatible servers that already run (``vllm
serve``, SGLang, llama.cpp's server). Each URL's ``GET /v1/models`` names the models it serves;
they become ``engine = "openai"`` models of one node (runtime/engines/upstream/,
docs/upstream.md) in a ``talaria runtime`` child process that ``serve`` starts, watches and
stops, as it does for ``--model``."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from talaria.runtime.engines.upstream import normalise_url

DISCOVERY_TIMEOUT_S = 10.0
"""How long one server's ``/v1/models`` may take to answer at start (each read, and the whole
list)."""
DISCOVERY_MAX_BYTES = 1 << 20
"""The most bytes of one server's model list read at start (the engine's default
``models_max_bytes``, runtime/engines/upstream/options.py)."""
SLEEP_KINDS = ("none", "vllm", "sglang")


class UpstreamError(ValueError):
    """An upstream server that does not answer, or serves no model, at start."""


@dataclass(frozen=True)
class Upstream:
    """One server: its base URL (``…/v1``) and the models it serves."""

    url: str
    models: tuple[str, ...]


def discover(urls: Sequence[str], timeout_s: float = DISCOVERY_TIMEOUT_S) -> list[Upstream]:
    """Each URL's models from its ``/v1/models``; ``UpstreamError`` naming the URL for one
    that does not answer, answers wrongly, lists no model, or repeats another's model."""
    found: list[Upstream] = []
    seen: dict[str, str] = {}
    with httpx.Client(timeout=timeout_s) as http:
        for given in urls:
            url = normalise_url(given)
            try:
                doc = json.loads(_model_list(http, url + "/models", timeout_s))
                models = tuple(str(m["id"]) for m in doc["data"])
            except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
                why = f"{type(exc).__name__}: {exc}"[:300]
                raise UpstreamError(f"upstream {url} did not list its models: {why}") from exc
            if not models:
                raise UpstreamError(f"upstream {url} serves no model")
            for model in models:
                if model in seen:
                    raise UpstreamError(f"model {model!r} is served by {seen[model]} and {url}")
                seen[model] = url
            found.append(Upstream(url, models))
    return found


def _model_list(http: httpx.Client, url: str, timeout_s: float) -> bytes:
    """``GET url``'s body, at most ``DISCOVERY_MAX_BYTES`` and ``timeout_s`` in all (a
    ``ValueError`` past either: a server that never ends its list does not hold ``serve``)."""
    deadline = time.monotonic() + timeout_s
    body = bytearray()
    with http.stream("GET", url, headers={"Accept-Encoding": "identity"}) as answer:
        answer.raise_for_status()
        for chunk in answer.iter_raw():
            body += chunk
            if len(body) > DISCOVERY_MAX_BYTES:
                raise ValueError(f"the list passed {DISCOVERY_MAX_BYTES} bytes")
            if time.monotonic() > deadline:
                raise ValueError(f"the list took longer than {timeout_s:g} s")
    return bytes(body)


def node_toml(upstreams: Sequence[Upstream], sleep: str, policy: str | None) -> str:
    """The node config of the upstreams' models (one ``[[model]]`` each, ``sleep`` for all)."""
    if sleep not in SLEEP_KINDS:
        raise UpstreamError(f"sleep must be one of {', '.join(SLEEP_KINDS)}, not {sleep!r}")
    lines = ["[node]", 'name = "upstream"']
    if policy:
        lines.append(f"policy = {json.dumps(policy)}")
    for upstream in upstreams:
        for model in upstream.models:
            lines += [
                "",
                "[[model]]",
                f"name = {json.dumps(model)}",
                'engine = "openai"',
                f"url = {json.dumps(upstream.url)}",
                f"sleep = {json.dumps(sleep)}",
            ]
    return "\n".join(lines) + "\n"
