"""``talaria serve --upstream URL``: front OpenAI-compatible servers that already run (``vllm
serve``, SGLang, llama.cpp's server). Each URL's ``GET /v1/models`` names the models it serves;
they become ``engine = "openai"`` models of one node (runtime/engines/upstream/,
docs/upstream.md) in a ``talaria runtime`` child process that ``serve`` starts, watches and
stops, as it does for ``--model``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from talaria.runtime.engines.upstream import normalise_url

DISCOVERY_TIMEOUT_S = 10.0
"""How long one server's ``/v1/models`` may take to answer at start."""
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
                answer = http.get(url + "/models")
                answer.raise_for_status()
                models = tuple(str(m["id"]) for m in answer.json()["data"])
            except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
                raise UpstreamError(f"upstream {url} did not list its models: {exc}") from exc
            if not models:
                raise UpstreamError(f"upstream {url} serves no model")
            for model in models:
                if model in seen:
                    raise UpstreamError(f"model {model!r} is served by {seen[model]} and {url}")
                seen[model] = url
            found.append(Upstream(url, models))
    return found


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
