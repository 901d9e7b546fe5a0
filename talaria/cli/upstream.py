"""``talaria serve --upstream URL``: front OpenAI-compatible servers that already run (``vllm
serve``, SGLang, llama.cpp's server). Each URL's ``GET /v1/models`` names the models it serves;
they become ``engine = "openai"`` models of a node (runtime/engines/upstream/,
docs/upstream.md) in a ``talaria runtime`` child process that ``serve`` starts, watches and
stops, as it does for ``--model``.

**Replicas.** Several servers of one model are its replicas: the servers are laid out on as
many nodes as the most replicated model has servers (``replica_nodes``: each server whole on
the first node that serves none of its models yet), a child runtime each, and the proxy routes
between those runtimes as between any instances of a model — a session's calls stay where its
KV is, a drained or unreachable runtime gets none. Replicas must be alike: the same context
window and, where the server reports it (llama.cpp's ``meta.n_vocab``), the same vocabulary;
otherwise ``discover`` refuses them, naming both servers."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from talaria.runtime.engines.upstream import normalise_url
from talaria.runtime.engines.upstream.client import served_window

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
    """One server: its base URL (``…/v1``), the models it serves, and what it reports of each
    that its replicas must share (``traits``: the context window, the vocabulary size)."""

    url: str
    models: tuple[str, ...]
    traits: dict[str, tuple[tuple[str, int | None], ...]] = field(default_factory=dict)


def traits_of(entry: dict[str, Any]) -> tuple[tuple[str, int | None], ...]:
    """What a ``/v1/models`` entry says that replicas of the model must agree on."""
    meta = entry.get("meta")
    vocab = meta.get("n_vocab") if isinstance(meta, dict) else None
    return (
        ("context window", served_window(entry)),
        ("vocabulary", vocab if isinstance(vocab, int) and not isinstance(vocab, bool) else None),
    )


def discover(urls: Sequence[str], timeout_s: float = DISCOVERY_TIMEOUT_S) -> list[Upstream]:
    """Each URL's models from its ``/v1/models``; ``UpstreamError`` naming the URL for one
    that does not answer, answers wrongly, lists no model, or is given twice, and naming both
    servers of a model whose replicas differ (``traits_of``)."""
    found: list[Upstream] = []
    with httpx.Client(timeout=timeout_s) as http:
        for given in urls:
            url = normalise_url(given)
            if any(u.url == url for u in found):
                raise UpstreamError(f"upstream {url} is given twice")
            try:
                doc = json.loads(_model_list(http, url + "/models", timeout_s))
                entries = {str(m["id"]): traits_of(m) for m in doc["data"]}
            except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError) as exc:
                why = f"{type(exc).__name__}: {exc}"[:300]
                raise UpstreamError(f"upstream {url} did not list its models: {why}") from exc
            if not entries:
                raise UpstreamError(f"upstream {url} serves no model")
            found.append(Upstream(url, tuple(entries), entries))
    _check_replicas(found)
    return found


def _check_replicas(found: Sequence[Upstream]) -> None:
    """Every server of a model reports the same traits as its first server."""
    first: dict[str, Upstream] = {}
    for upstream in found:
        for model in upstream.models:
            other = first.setdefault(model, upstream)
            theirs, ours = dict(other.traits[model]), dict(upstream.traits[model])
            for trait, value in ours.items():
                if value != theirs[trait]:
                    raise UpstreamError(
                        f"model {model!r}: {other.url} reports {trait} {theirs[trait]} and "
                        f"{upstream.url} {value}: replicas of one model must be alike"
                    )


def replica_nodes(found: Sequence[Upstream]) -> list[list[Upstream]]:
    """The servers laid out on nodes, no model twice on one: each server, in order, whole on
    the first node that serves none of its models (a server's models share its GPUs, so they
    stay on one node, which time-shares them)."""
    nodes: list[list[Upstream]] = []
    for upstream in found:
        for node in nodes:
            if not any(set(upstream.models) & set(u.models) for u in node):
                node.append(upstream)
                break
        else:
            nodes.append([upstream])
    return nodes


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


def node_toml(
    upstreams: Sequence[Upstream], sleep: str, policy: str | None, name: str = "upstream"
) -> str:
    """The node config of the upstreams' models (one ``[[model]]`` each, ``sleep`` for all)."""
    if sleep not in SLEEP_KINDS:
        raise UpstreamError(f"sleep must be one of {', '.join(SLEEP_KINDS)}, not {sleep!r}")
    lines = ["[node]", f"name = {json.dumps(name)}"]
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
