"""The pure rules that keep an upstream at arm's length (issue 46, item 5): output counted and
cut at the call's limit, usage checked against what was sent (runtime/engines/upstream/usage.py),
stream lines bounded (reading.py), the read bounds' options, and which upstream URLs a placed
model may name (runtime/placement_rules.py) — table-driven, with hypothesis properties."""

from __future__ import annotations

from typing import Any

import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st

from talaria.cli.runtime import upstream_prefixes
from talaria.core.calls import OutputDelta, ToolCallDelta
from talaria.core.catalog import load_catalog
from talaria.runtime.config import ModelConfig, NodeConfigError
from talaria.runtime.engines.upstream.options import upstream_options
from talaria.runtime.engines.upstream.reading import LineSplitter, UpstreamBoundExceeded
from talaria.runtime.engines.upstream.usage import (
    MAX_TOKEN_BYTES,
    OutputBudget,
    PromptBounds,
    checked_usage,
    delta_tokens,
    prompt_bounds,
    read_usage,
    reply_max_bytes,
)
from talaria.runtime.placement_rules import (
    UPSTREAM_PLACEABLE,
    PlacementRules,
    check_served,
    placed_model,
    url_allowed,
)

B = MAX_TOKEN_BYTES


@pytest.mark.parametrize(
    ("delta", "ids", "tokens"),
    [
        (OutputDelta("a"), 0, 1),  # a chunk holds at least one token
        (OutputDelta("a"), 3, 3),  # the token ids it carries
        (OutputDelta("x" * (B + 1)), 0, 2),  # at most B bytes a token
        (OutputDelta("", "r" * (2 * B)), 1, 2),  # reasoning counts
        (OutputDelta(tool_calls=(ToolCallDelta(0, "c", "f", "a" * (3 * B)),)), 0, 4),
        (OutputDelta("é" * B), 0, 2),  # bytes, not characters
    ],
)
def test_a_delta_counts_the_fewest_tokens_it_can_hold(
    delta: OutputDelta, ids: int, tokens: int
) -> None:
    assert delta_tokens(delta, ids) == tokens


def test_the_budget_drops_the_delta_that_would_pass_the_limit() -> None:
    budget = OutputBudget(8)
    taken = [budget.take(OutputDelta("x" * 1000), 0) for _ in range(3)]  # 4 tokens each
    assert taken == [True, True, False] and budget.cut
    assert budget.counted_tokens == 8 and budget.text_bytes == 2000
    assert budget.floor_tokens == 8  # ⌈2000 / 256⌉


@settings(max_examples=60, derandomize=True, deadline=None)
@given(
    limit=st.integers(0, 64),
    chunks=st.lists(st.tuples(st.text(max_size=600), st.integers(0, 6)), max_size=40),
)
def test_output_never_passes_the_limit_however_the_server_chunks_it(
    limit: int, chunks: list[tuple[str, int]]
) -> None:
    budget = OutputBudget(limit)
    for text, ids in chunks:
        if not budget.take(OutputDelta(text), ids):
            break
    assert budget.counted_tokens <= limit
    assert budget.floor_tokens <= budget.counted_tokens


def test_the_reply_bound_grows_with_the_limit() -> None:
    assert reply_max_bytes(0, 4096) == 65536
    assert reply_max_bytes(8, 4096) == 65536 + 8 * 4096


@pytest.mark.parametrize(
    ("messages", "body", "bounds"),
    [
        ([{"role": "user", "content": "hi"}], 100, PromptBounds(1, 100 + 4096)),
        ([{"role": "user", "content": "x" * 1000}], 1100, PromptBounds(4, 1100 + 4096)),
        (
            [{"role": "user", "content": [{"type": "text", "text": "x" * 600},
                                          {"type": "image_url", "image_url": {"url": "u"}}]}],
            700,
            PromptBounds(3, 700 + 4096 + 16384),
        ),
    ],
)  # fmt: skip
def test_prompt_bounds_follow_what_was_sent(
    messages: list[dict[str, Any]], body: int, bounds: PromptBounds
) -> None:
    assert prompt_bounds(messages, body) == bounds


PROMPT = PromptBounds(10, 5000)


@pytest.mark.parametrize(
    ("sent", "recorded", "faults"),
    [
        ((100, 5, 40), (100, 5, 40), 0),  # in range: as sent
        ((2_000_000_000, 5, 0), (5000, 5, 0), 1),  # the prompt at most the body's bytes
        ((100, 2_000_000_000, 0), (100, 8, 0), 1),  # output at most the limit
        ((100, -3, 0), (100, 2, 0), 1),  # at least what the text needs (2 tokens of text)
        ((100, 5, 2_000_000_000), (100, 5, 100), 1),  # cached at most the prompt
        ((1, 5, 0), (10, 5, 0), 1),  # the prompt at least its text
        ((None, None, 0), (50, 3, 0), 0),  # no usage: the estimate and the deltas' count
        ((100, 0, 0), (100, 3, 0), 0),  # 0 for a reply with text: not counted
    ],
)
def test_usage_is_clamped_into_its_range_and_each_fault_named(
    sent: tuple[int | None, int | None, int], recorded: tuple[int, int, int], faults: int
) -> None:
    budget = OutputBudget(8)
    budget.take(OutputDelta("x" * 300), 3)  # 3 tokens, 300 bytes: at least 2
    check = checked_usage(
        prompt_sent=sent[0],
        output_sent=sent[1],
        cached_sent=sent[2],
        prompt=PROMPT,
        prompt_estimate=50,
        budget=budget,
    )
    assert (check.prompt_tokens, check.output_tokens, check.cached_tokens) == recorded
    assert len(check.faults) == faults


@pytest.mark.parametrize(
    ("doc", "read"),
    [
        ({"prompt_tokens": 3, "completion_tokens": 2.0}, (3, 2, None)),
        ({"prompt_tokens": "3", "completion_tokens": True}, (None, None, None)),
        ({"prompt_tokens": float("nan"), "prompt_tokens_details": {"cached_tokens": 1}},
         (None, None, 1)),
        ({"prompt_tokens_details": "x"}, (None, None, None)),
    ],
)  # fmt: skip
def test_usage_counts_are_read_only_as_whole_numbers(
    doc: dict[str, Any], read: tuple[int | None, ...]
) -> None:
    usage = read_usage(doc)
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens) == read
    assert read_usage([1, 2]) is None


def test_lines_split_on_any_end_and_a_long_one_is_refused_before_it_is_held() -> None:
    lines = LineSplitter(8, "u")
    assert lines.feed(b"data: 1\r\ndata") == [b"data: 1"]
    assert lines.feed(b": 2\n\r: c\r") == [b"data: 2", b"", b": c"]
    assert lines.rest() == b""
    with pytest.raises(UpstreamBoundExceeded, match=r"line_max_bytes \(8 bytes\)"):
        lines.feed(b"x" * 9)
    with pytest.raises(UpstreamBoundExceeded):
        LineSplitter(8, "u").feed(b"data: too long\n")


@pytest.mark.parametrize(
    ("options", "fault"),
    [
        ({"line_max_bytes": 0}, "line_max_bytes"),
        ({"line_max_bytes": 1.5}, "line_max_bytes must be a positive integer"),
        ({"call_timeout_s": float("inf")}, "call_timeout_s"),
        ({"models_timeout_s": float("nan")}, "models_timeout_s"),
        ({"reply_bytes_per_token": -1}, "reply_bytes_per_token"),
        ({"cache_isolation": "none"}, "cache_isolation"),
    ],
)
def test_bad_bounds_are_refused_by_name(options: dict[str, Any], fault: str) -> None:
    with pytest.raises(NodeConfigError, match=fault):
        upstream_options("m", {"url": "http://h", **options})


def test_the_bounds_default_and_can_be_set() -> None:
    opt = upstream_options("m", {"url": "http://h"})
    assert (opt.models_max_bytes, opt.line_max_bytes, opt.reply_bytes_per_token) == (
        1 << 20,
        1 << 20,
        4096,
    )
    assert (opt.models_timeout_s, opt.call_timeout_s, opt.timeout_s) == (30.0, 1800.0, 600.0)
    small = upstream_options("m", {"url": "http://h", "line_max_bytes": 100, "call_timeout_s": 2})
    assert small.line_max_bytes == 100 and small.call_timeout_s == 2.0


PREFIXES = ("http://gpu1:8000", "https://api.example.com/v1/")


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://gpu1:8000/v1", True),
        ("http://GPU1:8000", True),
        ("https://api.example.com/v1", True),
        ("https://api.example.com:443/v1/extra", True),
        ("http://gpu1:80001/v1", False),  # a longer port
        ("http://gpu1:8000.evil.net/v1", False),  # a longer host
        ("http://gpu1/v1", False),  # another port
        ("https://gpu1:8000/v1", False),  # another scheme
        ("https://api.example.com/v10", False),  # a segment, not a string prefix
        ("https://api.example.com/", False),
        ("http://evil@gpu1:8000/v1", False),  # user info
        ("http://gpu1:8000@evil/v1", False),
        ("http://gpu1:8000/v1/../metrics", False),  # dot segments
        ("http://gpu1:8000/%2e%2e/metrics", False),  # escapes
        ("http://gpu1:8000//v1", False),
        ("http://gpu1:8000/v1?x=1", False),
        ("http://gpu1:8000/v1#x", False),
        ("http://gpu1:8000/v 1", False),
        ("http://gpu1:99999/v1", False),
        ("file:///etc/passwd", False),
    ],
)
def test_an_upstream_url_is_allowed_only_under_a_prefix_by_its_parts(
    url: str, allowed: bool
) -> None:
    assert url_allowed(url, PREFIXES) is allowed


def _placed(rules: PlacementRules, **options: Any) -> ModelConfig:
    return placed_model(ModelConfig("m", "openai", None, options), UPSTREAM_PLACEABLE, rules)


def test_a_placed_upstream_needs_an_allowed_prefix_and_no_operator_only_option() -> None:
    with pytest.raises(NodeConfigError, match="--allow-upstream-url"):
        _placed(PlacementRules(), url="http://gpu1:8000")
    rules = PlacementRules(upstream_urls=PREFIXES)
    assert _placed(rules, url="http://gpu1:8000/v1").options == {"url": "http://gpu1:8000/v1"}
    with pytest.raises(NodeConfigError, match="not under an allowed upstream URL prefix"):
        _placed(rules, url="http://gpu2:8000")
    for key in ("cache_isolation", "line_max_bytes", "call_timeout_s", "api_key_env"):
        with pytest.raises(NodeConfigError, match=f"unknown keys \\['{key}'\\]"):
            _placed(rules, url="http://gpu1:8000", **{key: 1})


@pytest.mark.parametrize(
    ("name", "served", "ok"),
    [
        ("glm-4.5-fp8", None, True),  # the name itself: the server must list it
        ("glm-4.5-fp8", "zai-org/GLM-4.5-FP8", True),  # the catalog's hf_id
        ("glm-4.5-fp8", "my-small-model", False),  # another model under a catalog name
        ("my-own-name", "my-small-model", True),  # not a catalog name
    ],
)
def test_a_placed_name_never_shadows_a_catalog_model(
    name: str, served: str | None, ok: bool
) -> None:
    options = {"url": "http://gpu1:8000"} | ({} if served is None else {"served_model": served})
    model = ModelConfig(name, "openai", None, options)
    if ok:
        check_served(model, UPSTREAM_PLACEABLE, load_catalog())
    else:
        with pytest.raises(NodeConfigError, match="catalog"):
            check_served(model, UPSTREAM_PLACEABLE, load_catalog())


def test_the_runtime_flag_takes_only_url_prefixes() -> None:
    assert upstream_prefixes([" http://gpu1:8000 ", "https://h/v1"]) == (
        "http://gpu1:8000",
        "https://h/v1",
    )
    assert upstream_prefixes(None) == ()
    for bad in ("gpu1:8000", "http://u@gpu1", "http://gpu1/?q", "ftp://gpu1"):
        with pytest.raises(typer.BadParameter):
            upstream_prefixes([bad])
