"""Trace format: round trips, determinism and one test per validation rule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from talaria.core.trace import (
    FIELDS,
    SessionTrace,
    TraceCall,
    TraceError,
    dumps_call,
    dumps_trace,
    parse_call,
    read_trace,
    write_trace,
)
from talaria.core.types import DEFAULT_TENANT, Priority


def _session(sid: str, start: float, n: int, model: str = "m") -> SessionTrace:
    calls = []
    prompt = 1000
    for i in range(n):
        out = 10 + i
        calls.append(
            TraceCall(
                session_id=sid,
                call_index=i,
                model=model,
                arrival_offset_s=start if i == 0 else start + 5.0 * i,
                prompt_tokens=prompt,
                new_tokens=prompt if i == 0 else 50,
                output_tokens=out,
                tool_gap_s=None if i == n - 1 else 0.25 * (i + 1),
                cached_tokens=None if i == 0 else prompt - 50,
                latency_s=None if i == 0 else 0.75 * i,
                ttft_s=None if i == 0 else 0.125,
                parent_session_id="père\u2028x" if sid == "child" else None,
            )
        )
        prompt += out + 50
    return SessionTrace(sid, model, start, tuple(calls))


SESSIONS = [_session("a", 0.0, 3), _session("child", 1.5, 2, model="m2"), _session("b", 0.0, 1)]


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write_trace(path, SESSIONS)
    back = read_trace(path)
    assert back == sorted(SESSIONS, key=lambda s: (s.start_s, s.session_id))
    assert [s.session_id for s in back] == ["a", "b", "child"]
    text = path.read_text(encoding="utf-8")
    assert "père\\u2028x" in text  # UTF-8 kept; U+2028 escaped so every reader sees 6 lines
    assert len(text.splitlines()) == 6


def test_properties() -> None:
    s = SESSIONS[0]
    assert s.num_calls == 3
    assert s.total_output_tokens == 10 + 11 + 12
    assert s.total_tool_gap_s == pytest.approx(0.25 + 0.5)


def test_write_is_deterministic_and_order_free(tmp_path: Path) -> None:
    one, two = tmp_path / "1.jsonl", tmp_path / "2.jsonl"
    write_trace(one, SESSIONS)
    write_trace(two, list(reversed(SESSIONS)))
    assert one.read_bytes() == two.read_bytes()
    assert one.read_text(encoding="utf-8") == dumps_trace(SESSIONS)
    first = json.loads(one.read_text().splitlines()[0])
    assert list(first) == [
        "session_id",
        "call_index",
        "model",
        "arrival_offset_s",
        "prompt_tokens",
        "new_tokens",
        "output_tokens",
        "tool_gap_s",
    ]


def test_measured_fields_are_written_in_order_and_read_back() -> None:
    call = TraceCall(
        *("s", 1, "m", 2.0, 120, 15, 5, None, 100, 3.25, 0.5, "p", 3, 60, "acme", Priority.BATCH),
        agent="claude-cli",
    )
    line = dumps_call(call)
    assert list(json.loads(line)) == list(FIELDS)
    assert list(FIELDS[FIELDS.index("cached_tokens") :]) == [
        "cached_tokens",
        "latency_s",
        "ttft_s",
        "parent_session_id",
        "parent_call_index",
        "parent_prefix_tokens",
        "tenant",
        "priority",
        "agent",
    ]
    assert parse_call(line, "x:1") == call
    # omitted when None; integers are accepted as floats, as for the other float fields
    assert "latency_s" not in dumps_call(TraceCall("s", 0, "m", 0.0, 10, 10, 1, None))
    parsed = parse_call(_j(latency_s=2, ttft_s=0), "x:1")
    assert (parsed.latency_s, parsed.ttft_s) == (2.0, 0.0)
    assert isinstance(parsed.latency_s, float) and isinstance(parsed.ttft_s, float)
    assert parse_call(_j(latency_s=None), "x:1").latency_s is None
    # tenant, priority and agent: omitted at their defaults, read back as them when absent
    plain = dumps_call(TraceCall("s", 0, "m", 0.0, 10, 10, 1, None))
    assert "tenant" not in plain and "priority" not in plain and "agent" not in plain
    read = parse_call(plain, "x:1")
    assert (read.tenant, read.priority, read.agent) == (DEFAULT_TENANT, Priority.STANDARD, "")


def test_shuffled_lines_blanks_and_comments(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write_trace(path, SESSIONS)
    lines = path.read_text().splitlines()
    path.write_text("# a comment\n\n" + "\n".join(reversed(lines)) + "\n   \n")
    assert read_trace(path) == sorted(SESSIONS, key=lambda s: (s.start_s, s.session_id))


def test_dumps_parse_round_trip() -> None:
    call = SESSIONS[1].calls[1]
    assert parse_call(dumps_call(call), "x:1") == call
    assert dumps_call(call).count("\n") == 0


def test_absent_gap_on_last_call_reads_as_null(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(_row(tool_gap_s=_DROP)) + "\n")
    assert read_trace(path)[0].calls[0].tool_gap_s is None


_DROP = object()


def _row(**changes: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "session_id": "s",
        "call_index": 0,
        "model": "m",
        "arrival_offset_s": 0.0,
        "prompt_tokens": 100,
        "new_tokens": 100,
        "output_tokens": 5,
        "tool_gap_s": None,
    }
    for key, value in changes.items():
        if value is _DROP:
            row.pop(key, None)
        else:
            row[key] = value
    return row


def _j(**changes: Any) -> str:
    return json.dumps(_row(**changes))


_C0 = _j(tool_gap_s=1.0)  # a valid call 0 followed by more calls


def _c1(**changes: Any) -> str:
    """Call 1 of session "s" (after _C0)."""
    return _j(**{"call_index": 1, "prompt_tokens": 120, "new_tokens": 15, **changes})


# (lines of the file, 1-based line of the error, field named in the message or None)
BAD: dict[str, tuple[list[str], int, str | None]] = {
    "not json": ([_C0, "{nope"], 2, None),
    "not an object": (["[1, 2]"], 1, None),
    "unknown field": ([_j(colour="red")], 1, "colour"),
    "missing field": ([_j(prompt_tokens=_DROP)], 1, "prompt_tokens"),
    "zero prompt": ([_j(prompt_tokens=0, new_tokens=0)], 1, "prompt_tokens"),
    "string int": ([_j(prompt_tokens="100")], 1, "prompt_tokens"),
    "bool int": ([_j(output_tokens=True)], 1, "output_tokens"),
    "float int": ([_j(call_index=0.0)], 1, "call_index"),
    "negative index": ([_j(call_index=-1)], 1, "call_index"),
    "new above prompt": ([_j(new_tokens=101)], 1, "new_tokens"),
    "negative new": ([_C0, _c1(new_tokens=-1)], 2, "new_tokens"),
    "zero output": ([_j(output_tokens=0)], 1, "output_tokens"),
    "negative offset": ([_j(arrival_offset_s=-1.0)], 1, "arrival_offset_s"),
    "nan offset": ([_j(arrival_offset_s=float("nan"))], 1, "arrival_offset_s"),
    "inf gap": ([_j(tool_gap_s=float("inf")), _c1()], 1, "tool_gap_s"),
    "string offset": ([_j(arrival_offset_s="0")], 1, "arrival_offset_s"),
    "negative gap": ([_j(tool_gap_s=-0.5), _c1()], 1, "tool_gap_s"),
    "string gap": ([_j(tool_gap_s="fast"), _c1()], 1, "tool_gap_s"),
    "empty session id": ([_j(session_id="")], 1, "session_id"),
    "int model": ([_j(model=3)], 1, "model"),
    "cached above prompt": ([_j(cached_tokens=101)], 1, "cached_tokens"),
    "negative latency": ([_j(latency_s=-0.1)], 1, "latency_s"),
    "inf latency": ([_j(latency_s=float("inf"))], 1, "latency_s"),
    "string latency": ([_j(latency_s="1")], 1, "latency_s"),
    "negative ttft": ([_j(ttft_s=-1)], 1, "ttft_s"),
    "nan ttft": ([_j(ttft_s=float("nan"))], 1, "ttft_s"),
    "bool ttft": ([_j(ttft_s=True)], 1, "ttft_s"),
    "empty parent": ([_j(parent_session_id="")], 1, "parent_session_id"),
    "spawn without parent": ([_j(parent_call_index=0)], 1, "parent_call_index"),
    "prefix without parent": ([_j(parent_prefix_tokens=10)], 1, "parent_prefix_tokens"),
    "negative spawn": ([_j(parent_session_id="p", parent_call_index=-1)], 1, "parent_call_index"),
    "float spawn": ([_j(parent_session_id="p", parent_call_index=1.0)], 1, "parent_call_index"),
    "prefix above prompt": (
        [_j(parent_session_id="p", parent_prefix_tokens=101)],
        1,
        "parent_prefix_tokens",
    ),
    "duplicate index": ([_C0, _c1(), _c1()], 3, "call_index"),
    "index gap": ([_C0, _c1(call_index=2)], 2, "call_index"),
    "no call 0": ([_c1()], 1, "call_index"),
    "model changes": ([_C0, _c1(model="other")], 2, "model"),
    "tenant changes": ([_j(tool_gap_s=1.0, tenant="a"), _c1(tenant="b")], 2, "tenant"),
    "priority changes": ([_C0, _c1(priority="batch")], 2, "priority"),
    "unknown priority": ([_j(priority="urgent")], 1, "priority"),
    "int tenant": ([_j(tenant=3)], 1, "tenant"),
    "agent changes": ([_j(tool_gap_s=1.0, agent="a"), _c1(agent="b")], 2, "agent"),
    "empty agent": ([_j(agent="")], 1, "agent"),
    "gap on last call": (["# c", _C0], 2, "tool_gap_s"),
    "null gap mid-session": ([_j(), _c1()], 1, "tool_gap_s"),
    "absent gap mid-session": ([_j(tool_gap_s=_DROP), _c1()], 1, "tool_gap_s"),
    "call 0 new != prompt": ([_j(new_tokens=50)], 1, "new_tokens"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_lines(tmp_path: Path, case: str) -> None:
    lines, lineno, field = BAD[case]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError) as info:
        read_trace(path)
    msg = str(info.value)
    assert f"{path}:{lineno}:" in msg
    if field is not None:
        assert f"'{field}'" in msg


def test_write_rejects_inconsistent_sessions(tmp_path: Path) -> None:
    good = SESSIONS[0]
    path = tmp_path / "t.jsonl"
    with pytest.raises(TraceError, match="call_index"):
        write_trace(path, [SessionTrace("a", "m", 0.0, good.calls[1:])])
    with pytest.raises(TraceError, match="start_s"):
        write_trace(path, [SessionTrace("a", "m", 3.0, good.calls)])
    with pytest.raises(TraceError, match="duplicate"):
        write_trace(path, [good, good])
    with pytest.raises(TraceError, match="output_tokens"):
        bad = TraceCall("b", 0, "m", 0.0, 10, 10, 0, None)
        write_trace(path, [SessionTrace("b", "m", 0.0, (bad,))])


def test_index_messages(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join([_C0, _c1(tool_gap_s=1.0), _c1()]) + "\n")
    with pytest.raises(TraceError, match=r":3: .*duplicate call 1"):
        read_trace(path)
    path.write_text("\n".join([_C0, _c1(call_index=2)]) + "\n")
    with pytest.raises(TraceError, match=r":2: .*missing call 1"):
        read_trace(path)
