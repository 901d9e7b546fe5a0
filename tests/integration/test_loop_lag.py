"""No request up to the body limit holds the proxy's event loop: hostile bodies go through the
real HTTP stack (``talaria serve``'s app and bounded HTTP edge, bench/harness/lag.py) while a
probe in the server's loop notes how late its 1 ms sleeps wake up, and another thread asks
``/healthz`` again and again. Each body is answered below 500 in its API's envelope within
``ANSWER_S``, every ``/healthz`` within ``HEALTHZ_S``, and the loop never lags ``LAG_S``.

The bodies: the finding (1,000 tools, each an object whose array asks for 4,000 items, just
under the old per-tool schema budget: 6–10 s of the loop before one budget per request and
the cap on tools), every shape of bench/harness/hostile.py filled to the body limit, and
bodies hypothesis composes of the same ingredients. The proxy keeps a bound of 100 ms
(bench/loop_lag.py measures it; docs/operations.md). The thresholds here are margins a slow,
loaded machine cannot miss (1 s failed CI once) that still fail what the bodies cost before:
on this 2-core machine (2026-12-05) the worst lag of any of these bodies was 69 ms, /healthz
74 ms, an answer 0.25 s (the finding's 25 ms); with three busy processes beside the test
0.40 s, 0.38 s, 0.70 s (80 ms). Before the bounds the finding held the loop 6.4–7.0 s and
4 million token ids 32 s (docs/operations.md), and a slower machine takes longer still."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.harness.hostile import HI, PATHS, SHAPES, encode, fill, near_budget_schema, nested
from bench.harness.lag import InProcessProxy, proxy_in_thread

MODEL = "qwen3-coder-480b-a35b-fp8"
"""The catalog's largest context window: the most of a body is admitted and run."""
ANSWER_S = 5.0
"""A hostile body is answered within this (8 MiB cross the loopback first): 7× the slowest
answer under load (0.70 s)."""
HEALTHZ_S = 3.0
"""Every ``/healthz`` meanwhile: 8× the slowest under load (0.38 s)."""
LAG_S = 3.0
"""The loop's worst lag: 7× the worst under load (0.40 s), under half the finding's 6.4 s."""
FINDING_S = 3.0
"""The finding is answered within this: 80 ms under load, 6.4–7.0 s before the bounds."""


@pytest.fixture(scope="module")
def proxy() -> Iterator[InProcessProxy]:
    """The proxy as ``talaria serve`` runs it, whose start-up objects are frozen out of the
    collector's reach. Here the process also holds every earlier test's objects: a full
    collection walking them held the loop 1.2 s in CI (0.1 s on an idle run), a cost of the
    test process, not of the body. So they are frozen too for this module (the proxy's
    start-up collects, then freezes), and given back to the collector after it."""
    gc.freeze()
    try:
        with proxy_in_thread(models=[MODEL], time_scale=200.0) as served:
            yield served
    finally:
        gc.unfreeze()


@dataclass
class Watched:
    """One request sent while ``/healthz`` was asked throughout."""

    response: httpx.Response
    answer_s: float
    worst_lag_s: float
    healthz_s: list[float]
    healthz_statuses: set[int]


def send_watched(proxy: InProcessProxy, path: str, body: bytes) -> Watched:
    """``body`` sent to ``path`` while another thread asks ``/healthz`` without pause (the
    first answer comes before the body is sent); the probe reset just before."""
    done, polling = threading.Event(), threading.Event()
    times: list[float] = []
    statuses: set[int] = set()

    def poll() -> None:
        with httpx.Client(base_url=proxy.base_url, timeout=30) as http:
            while not done.is_set():
                started = time.perf_counter()
                statuses.add(http.get("/healthz").status_code)
                times.append(time.perf_counter() - started)
                polling.set()

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    assert polling.wait(timeout=30)
    proxy.reset()
    with httpx.Client(base_url=proxy.base_url, timeout=60) as http:
        started = time.perf_counter()
        response = http.post(path, content=body, headers={"content-type": "application/json"})
        answer_s = time.perf_counter() - started
        statuses.add(http.get("/healthz").status_code)  # after the work it left behind
    done.set()
    poller.join(timeout=60)
    return Watched(response, answer_s, proxy.worst_lag_s(), times, statuses)


def assert_bounded(watched: Watched, api: str) -> None:
    """The loop and /healthz never held; answered below 500 in the API's envelope, in time."""
    assert watched.worst_lag_s < LAG_S, f"the loop lagged {watched.worst_lag_s:.2f} s"
    assert max(watched.healthz_s) < HEALTHZ_S, f"/healthz took {max(watched.healthz_s):.2f} s"
    assert watched.healthz_statuses == {200}  # 503: the watchdog saw a stall
    response = watched.response
    assert response.status_code < 500, response.text[:500]
    if response.status_code >= 400:
        error = response.json()
        if api == "messages":
            assert error["type"] == "error" and error["error"]["type"], error
        else:
            assert error["error"]["message"], error
    assert watched.answer_s < ANSWER_S


def _finding(api: str, tools: int, prefix: str) -> dict[str, Any]:
    schema = near_budget_schema()
    if api == "chat":
        entries = [{"type": "function", "function": {"name": f"{prefix}{i}", "parameters": schema}}
                   for i in range(tools)]  # fmt: skip
        return {"model": MODEL, "messages": HI, "tools": entries}
    if api == "messages":
        entries = [{"name": f"{prefix}{i}", "input_schema": schema} for i in range(tools)]
        return {"model": MODEL, "max_tokens": 16, "messages": HI, "tools": entries}
    entries = [{"type": "function", "name": f"{prefix}{i}", "parameters": schema}
               for i in range(tools)]  # fmt: skip
    return {"model": MODEL, "input": "hi", "tools": entries}


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
def test_a_thousand_tools_near_the_schema_budget_never_hold_the_loop(
    proxy: InProcessProxy, api: str
) -> None:
    """The finding, within ``FINDING_S``: refused past the cap on tools; under it (400 tools),
    refused by the request's one schema budget, naming the request."""
    watched = send_watched(proxy, PATHS[api], encode(_finding(api, 1000, f"{api}-a")))
    assert_bounded(watched, api)
    assert watched.response.status_code == 400 and watched.answer_s < FINDING_S
    together = send_watched(proxy, PATHS[api], encode(_finding(api, 400, f"{api}-b")))
    assert_bounded(together, api)
    assert together.response.status_code == 400 and together.answer_s < FINDING_S
    error = together.response.json()["error"]
    assert "together" in error["message"]
    if api != "messages":
        assert error["code"] == "schema_too_large" and error["param"] == "tools"


@pytest.mark.parametrize("shape", SHAPES, ids=[s.label for s in SHAPES])
def test_every_hostile_shape_at_the_body_limit_is_bounded(
    proxy: InProcessProxy, shape: Any
) -> None:
    body, _ = fill(shape, MODEL, proxy.max_request_bytes)
    assert_bounded(send_watched(proxy, shape.path, body), shape.api)


INGREDIENTS = ("messages", "parts", "tool calls", "tools", "stop", "members", "arrays", "text")
"""What a generated body is made of, each ``count`` times, where its API carries it: tiny
messages, content parts, tool calls, tiny tools, stop sequences, members of an object (the
first tool's schema on Anthropic's API, else an unknown field), empty arrays, and words of
text."""

COUNTS = st.sampled_from([0, 1, 4_000, 8_193, 20_000, 70_000, 150_000])


def compose(api: str, counts: dict[str, int]) -> dict[str, Any]:
    """A body of ``api`` holding ``counts`` of each ingredient of ``INGREDIENTS``."""

    def times(name: str) -> range:
        return range(counts.get(name, 0))

    text = "word " * counts.get("text", 0) or "hi"
    said = [{"role": "user", "content": f"m{i}"} for i in times("messages")]
    stop = [f"s{i}" for i in times("stop")]
    names = [f"t{i}" for i in times("tools")]
    members = {f"k{i}": 1 for i in times("members")}
    arrays: list[Any] = [[] for _ in times("arrays")]
    junk = {"members": members, "arrays": arrays}
    if api == "chat":
        parts = [{"type": "text", "text": f"p{i}"} for i in times("parts")] or text
        calls = [{"id": f"c{i}", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
                 for i in times("tool calls")]  # fmt: skip
        messages = [*said, {"role": "user", "content": parts}]
        if calls:
            messages.append({"role": "assistant", "tool_calls": calls})
        tools = [{"type": "function", "function": {"name": n}} for n in names]
        return {"model": MODEL, "messages": messages, "tools": tools, "stop": stop, "junk": junk}
    if api == "messages":
        blocks = [{"type": "text", "text": f"p{i}"} for i in times("parts")] or text
        uses = [{"type": "tool_use", "id": f"u{i}", "name": "ls", "input": {}}
                for i in times("tool calls")]  # fmt: skip
        messages = [*said, {"role": "user", "content": blocks}]
        if uses:
            messages += [{"role": "assistant", "content": uses}, {"role": "user", "content": "go"}]
        tools = [{"name": n, "input_schema": {"type": "object"}} for n in names]
        if tools:  # one schema of many properties
            tools[0]["input_schema"] = {"type": "object", "properties": members}
        return {"model": MODEL, "max_tokens": 16, "messages": messages, "tools": tools,
                "stop_sequences": stop, "system": text, "junk": arrays}  # fmt: skip
    if api == "responses":
        parts = [{"type": "input_text", "text": f"p{i}"} for i in times("parts")] or text
        calls = [{"type": "function_call", "call_id": f"c{i}", "name": "ls", "arguments": "{}"}
                 for i in times("tool calls")]  # fmt: skip
        items = [*said, {"role": "user", "content": parts}, *calls]
        tools = [{"type": "function", "name": n} for n in names]
        return {"model": MODEL, "input": items, "tools": tools, "instructions": text, "junk": junk}
    return {"model": MODEL, "prompt": stop or text, "messages": said, "junk": junk}


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    api=st.sampled_from(sorted(PATHS)),
    counts=st.dictionaries(st.sampled_from(sorted(INGREDIENTS)), COUNTS, min_size=1, max_size=3),
    deep=st.booleans(),
)
def test_generated_hostile_bodies_are_bounded(
    proxy: InProcessProxy, api: str, counts: dict[str, int], deep: bool
) -> None:
    """Bodies of one to three ingredients in counts from none to 150,000 (some past the body
    limit: a 413), on any API, some with a value nested 900 deep: each bounded."""
    body = compose(api, counts)
    if deep:
        body["deep"] = nested(900)
    assert_bounded(send_watched(proxy, PATHS[api], encode(body)), api)


def test_a_response_chain_cannot_grow_past_the_items_bound(proxy: InProcessProxy) -> None:
    """Each continuation's call holds its stored history: a chain is refused once the history
    and the new input together pass the bound on items, so no chain grows a call's work."""

    def said(count: int, tag: str) -> list[dict[str, Any]]:
        return [{"role": "user", "content": f"{tag}{i}"} for i in range(count)]

    with httpx.Client(base_url=proxy.base_url, timeout=60) as http:
        first = http.post("/v1/responses", json={"model": MODEL, "input": said(8_000, "a")})
        assert first.status_code == 200, first.text
        chained = {"model": MODEL, "previous_response_id": first.json()["id"]}
        more = http.post("/v1/responses", json={**chained, "input": said(10, "b")})
        assert more.status_code == 200, more.text
        refused = http.post("/v1/responses", json={**chained, "input": said(500, "c")})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "too_many_items" and error["param"] == "previous_response_id"
