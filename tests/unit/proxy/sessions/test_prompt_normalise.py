"""Prompt normalisation's table (proxy/sessions/normalise.py): Claude Code's attribution line is
taken out of system text, with its line end, in every form the pinned executable builds, and
nothing else is; the operator's patterns join the table, and one that is not a regular
expression stops the proxy at start naming it; the work stays within its bounds."""

from __future__ import annotations

import random
from typing import Any

import pytest

from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.edge.app import create_app
from talaria.proxy.sessions.conversation import Conversation
from talaria.proxy.sessions.normalise import (
    MAX_PATTERNS,
    MAX_SCAN_CHARS,
    MAX_SYSTEM_MESSAGES,
    VOLATILE_PARTS,
    normalise,
    prompt_parts,
    strip_text,
)

ATTRIBUTION = "claude-code-attribution"
REST = "You are Claude Code, Anthropic's official CLI for Claude."
HEADER = "x-anthropic-billing-header:"


def _line(rng: random.Random, *extra: str) -> str:
    """An attribution line as Claude Code 2.1.328 builds it: its version with a per-session
    fingerprint, an entrypoint, then the fields given (docs/sources.md §9)."""
    fingerprint = "".join(rng.choice("0123456789abcdef") for _ in range(3))
    fields = [f"cc_version=2.1.328.{fingerprint}", "cc_entrypoint=sdk-cli", *extra]
    return f"{HEADER} " + " ".join(f"{f};" for f in fields)


LINES = [
    (),
    ("cch=00000",),
    ("cch=7c2e1",),
    ("cc_gateway=env",),
    ("cch=a9f03", "cc_workload=cron", "cc_is_subagent=true"),
    ("cc_prev_req=req_011CV7nGq5Jd8", "cc_prompt_id=1b4e28ba-2fa1-11d2-883f-0016d3cca427"),
    ("cc_turn_origin=user", "cc_prompt_index=3", "cc_turn_index=1", "cc_gateway=1"),
    ("cc_project=claude_proj_01ARZ3NDEKTSV4RRFFQ69G5FAV", "cc_project_src=user"),
    ("cc_prev_msg=msg_01XFDUDYJgAACzvnptvVoYEL", "cc_dispatch_entrypoint=cli"),
]


@pytest.mark.parametrize("extra", LINES)
@pytest.mark.parametrize("end", ["\n", "\r\n", ""])
def test_the_attribution_line_is_taken_out_with_its_line_end(
    extra: tuple[str, ...], end: str
) -> None:
    line = _line(random.Random(f"{extra}{end!r}"), *extra)
    rest = REST if end else ""  # without a line end, the line is the whole text
    assert strip_text(line + end + rest, VOLATILE_PARTS) == (rest, {ATTRIBUTION})


@pytest.mark.parametrize(
    "text",
    [
        f"{HEADER} cc_version=2.1.328.abc; cc_entrypoint=cli; and some words",  # more text after
        f"{HEADER} cc_version=2.1.328.abc; cc_entrypoint=cli",  # no closing ;
        f"{HEADER} cc_version=2.1.328.abc;cc_entrypoint=cli;",  # fields not joined by a space
        f"{HEADER}  cc_version=2.1.328.abc;",  # two spaces
        f"{HEADER} cc_entrypoint=cli; cc_version=2.1.328.abc;",  # not the version first
        f"{HEADER} cc_version=2.1.328.abc; note=1;",  # a field that is not Claude Code's
        f"{HEADER} cc_version=2.1.328 abc; cc_entrypoint=cli;",  # a value with a space
        f"{HEADER} cc_version=2.1.328.abc; CC_ENTRYPOINT=cli;",  # a key in capitals
        "X-Anthropic-Billing-Header: cc_version=2.1.328.abc;",  # another header's spelling
        "x-anthropic-billing: cc_version=2.1.328.abc;",
        f"Note: {HEADER} cc_version=2.1.328.abc;",  # not at a line's start
        f" {HEADER} cc_version=2.1.328.abc;",
        f"{HEADER} cc_version={'9' * 129};",  # a value past 128 characters
        f"{HEADER}",
        "cc_version=2.1.328.abc; cc_entrypoint=cli;",
    ],
)
def test_near_misses_stay(text: str) -> None:
    whole = f"{text}\n{REST}"
    assert strip_text(whole, VOLATILE_PARTS) == (whole, set())


def test_a_line_in_the_middle_goes_only_in_the_attribution_lines_form() -> None:
    line = _line(random.Random(1), "cch=00000")
    text = f"first line\n{line}\nlast line"
    assert strip_text(text, VOLATILE_PARTS) == ("first line\nlast line", {ATTRIBUTION})
    quoted = f"first line\nthe header looks like: {line}\nlast line"
    assert strip_text(quoted, VOLATILE_PARTS) == (quoted, set())
    both = f"{line}\nmiddle\n{_line(random.Random(2))}\n"
    assert strip_text(both, VOLATILE_PARTS) == ("middle\n", {ATTRIBUTION})


def _system(rng: random.Random) -> str:
    """Claude Code's system blocks as the Messages dialect joins them (newlines)."""
    return f"{_line(rng, f'cch={rng.randrange(16**5):05x}')}\n{REST}"


def test_normalise_takes_it_out_of_system_and_developer_messages_only() -> None:
    rng = random.Random(7)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": _system(rng)},
        {"role": "user", "content": _line(rng)},  # a user may paste it: it stays
        {"role": "developer", "content": [{"type": "text", "text": _system(rng)}]},
        {"role": "assistant", "content": "ok"},
    ]
    found = normalise(messages, VOLATILE_PARTS)
    assert found is not None and found.engine
    assert (found.parts, found.first) == ((ATTRIBUTION,), 0)
    assert found.messages[0] == {"role": "system", "content": REST}
    assert found.messages[2] == {"role": "developer", "content": [{"type": "text", "text": REST}]}
    assert found.messages[1] is messages[1] and found.messages[3] is messages[3]  # untouched
    assert messages[0]["content"] != REST  # the client's own messages are not changed
    assert normalise(found.messages, VOLATILE_PARTS) is None  # nothing left to take out


def test_every_turns_line_gives_the_same_conversation() -> None:
    """A different ``cch`` (and fingerprint) each request: the same fingerprints once
    normalised, different ones before."""
    rng = random.Random(11)
    turns = [
        [{"role": "system", "content": _system(rng)}, {"role": "user", "content": "fix it"}]
        for _ in range(5)
    ]
    raw = {Conversation.of(t).last for t in turns}
    normalised = set()
    for t in turns:
        found = normalise(t, VOLATILE_PARTS)
        assert found is not None and found.first == 0
        normalised.add(Conversation.of(found.messages).last)
    assert len(raw) == 5 and len(normalised) == 1


def test_the_work_is_bounded() -> None:
    """Only the head of a system message (cut back to a line's end) and only its first
    ``MAX_SYSTEM_MESSAGES`` system messages are looked at."""
    line = _line(random.Random(3))
    far = "x" * (MAX_SCAN_CHARS - 10) + "\n" + line + "\n"  # the line crosses the window
    assert strip_text(far, VOLATILE_PARTS) == (far, set())
    one_long_line = "x" * (MAX_SCAN_CHARS + 1) + "\n" + line
    assert strip_text(one_long_line, VOLATILE_PARTS) == (one_long_line, set())
    near = "x" * 100 + "\n" + line + "\n" + "y" * MAX_SCAN_CHARS
    assert strip_text(near, VOLATILE_PARTS) == (
        "x" * 100 + "\n" + "y" * MAX_SCAN_CHARS,
        {ATTRIBUTION},
    )
    systems = [{"role": "system", "content": "notes"}] * MAX_SYSTEM_MESSAGES
    late = [*systems, {"role": "system", "content": line + "\n" + REST}]
    assert normalise(late, VOLATILE_PARTS) is None


def test_an_operators_patterns_join_the_table_in_order() -> None:
    parts = prompt_parts("(?m)^Today is \\d{4}-\\d{2}-\\d{2}\\.\\n?\n\n  session \\d+  \n")
    assert [p.name for p in parts] == [ATTRIBUTION, "operator-1", "operator-2"]
    text = f"{_line(random.Random(5))}\nToday is 2026-12-04.\nWork in session 42 now."
    found = normalise([{"role": "system", "content": text}], parts)
    assert found is not None
    assert found.parts == (ATTRIBUTION, "operator-1", "operator-2")
    assert found.messages[0]["content"] == "Work in  now."
    assert prompt_parts("") == VOLATILE_PARTS


@pytest.mark.parametrize(
    ("patterns", "said"),
    [
        ("(unclosed", "TALARIA_PROMPT_PATTERNS: pattern 1 '(unclosed' is not a regular expression"),
        ("ok\n[z-a]", "TALARIA_PROMPT_PATTERNS: pattern 2 '[z-a]' is not a regular expression"),
        ("x" * 1001, "TALARIA_PROMPT_PATTERNS: pattern 1 is longer than 1000 characters"),
        ("a\n" * (MAX_PATTERNS + 1), f"at most {MAX_PATTERNS}"),
    ],
)
def test_a_bad_pattern_is_refused_naming_it(patterns: str, said: str) -> None:
    with pytest.raises(ValueError) as refused:
        prompt_parts(patterns)
    assert said in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(ValueError, match="TALARIA_PROMPT_PATTERNS"):  # the proxy does not start
        create_app(ProxySettings(prompt_patterns=patterns))
