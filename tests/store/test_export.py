"""``talaria trace export``: the pure conversion, the query on both backends, and the command."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine
from typer.testing import CliRunner

from talaria.cli import app
from talaria.core.trace import SessionTrace, read_trace, write_trace
from talaria.proxy.contract.records import CallRecord, Record, SessionRecord
from talaria.proxy.store import migrate
from talaria.proxy.store.db import make_engine, make_sessionmaker
from talaria.proxy.store.export import (
    ExportError,
    calls_to_sessions,
    export_trace,
    parse_time,
)
from talaria.proxy.store.repository import SqlStore

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def call(
    sid: str,
    index: int,
    arrived: float,
    finished: float | None,
    prompt: int,
    output: int,
    **kw: object,
) -> CallRecord:
    """A call of ``sid`` arriving and finishing ``arrived`` / ``finished`` s after T0."""
    fields: dict[str, object] = {
        "request_id": f"{sid}-{index}-{arrived}",
        "session_key": sid,
        "call_index": index,
        "model": "glm-4.5-fp8",
        "instance": "node0",
        "arrived_at": at(arrived),
        "finished_at": None if finished is None else at(finished),
        "status": "ok",
        "queue_s": 0.25,
        "prefill_s": 0.5,
        "prompt_tokens": prompt,
        "cached_tokens": 0,
        "output_tokens": output,
    }
    fields.update(kw)
    return CallRecord(**fields)  # type: ignore[arg-type]


def failed(sid: str, index: int, arrived: float) -> CallRecord:
    return call(sid, index, arrived, arrived + 0.1, 50, 0, status="error", error="boom")


def column(sessions: Sequence[SessionTrace], name: str) -> dict[str, list[object]]:
    """``name`` of every call, by session."""
    return {s.session_id: [getattr(c, name) for c in s.calls] for s in sessions}


# -- the pure conversion ------------------------------------------------------------------

# Session "a": an append (50 new), a call sent 0.1 s before the previous answer was complete
# (gap 0) whose prompt is shorter than the previous prompt + output (a truncation: all new),
# then an exact continuation (0 new). Session "b" starts 1 s later. A failed call of "z" at
# -5 s is not exported, so it does not move the origin.
CALLS = [
    call("a", 0, 0.0, 2.0, 1000, 100, cached_tokens=0),
    call("a", 1, 2.5, 4.0, 1150, 20, cached_tokens=1088),
    call("a", 2, 3.9, 6.0, 500, 10, queue_s=None),
    call("a", 3, 7.25, 9.0, 510, 5, cached_tokens=496),
    call("b", 0, 1.0, 1.5, 300, 7),
    failed("z", 0, -5.0),
]

# field → expected values by session
EXPECTED: dict[str, dict[str, list[object]]] = {
    "call_index": {"a": [0, 1, 2, 3], "b": [0]},
    "arrival_offset_s": {"a": [0.0, 2.5, 3.9, 7.25], "b": [1.0]},
    "new_tokens": {"a": [1000, 50, 500, 0], "b": [300]},
    "tool_gap_s": {"a": [0.5, 0.0, 1.25, None], "b": [None]},
    "cached_tokens": {"a": [0, 1088, 0, 496], "b": [0]},
    "latency_s": {"a": [2.0, 1.5, 2.1, 1.75], "b": [0.5]},
    "ttft_s": {"a": [0.75, 0.75, None, 0.75], "b": [0.75]},
    "parent_session_id": {"a": [None] * 4, "b": ["a"]},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_conversion_fields(name: str) -> None:
    sessions = calls_to_sessions(reversed(CALLS), {"a": None, "b": "a"})
    got = column(sessions, name)
    want = EXPECTED[name]
    assert got.keys() == want.keys()
    for sid, values in want.items():
        assert got[sid] == pytest.approx(values), sid


def test_conversion_sessions_and_order() -> None:
    sessions = calls_to_sessions(CALLS, {"b": "a"})
    assert [(s.session_id, s.model, s.start_s, s.num_calls) for s in sessions] == [
        ("a", "glm-4.5-fp8", 0.0, 4),
        ("b", "glm-4.5-fp8", 1.0, 1),
    ]
    assert calls_to_sessions([], {}) == []
    assert calls_to_sessions([failed("z", 0, 0.0)], {}) == []


def test_failed_and_unfinished_calls_are_dropped_and_the_rest_renumbered() -> None:
    calls = [
        call("s", 0, 10.0, 11.0, 100, 10),
        failed("s", 1, 12.0),
        call("s", 2, 13.0, 14.0, 130, 10),
        call("s", 3, 15.0, None, 150, 10),  # never finished: not exported
        failed("only-failures", 0, 9.0),
    ]
    (session,) = calls_to_sessions(calls, {})
    assert session.session_id == "s" and session.start_s == 0.0
    assert [c.call_index for c in session.calls] == [0, 1]
    assert [c.new_tokens for c in session.calls] == [100, 20]  # 130 − (100 + 10)
    assert [c.tool_gap_s for c in session.calls] == [2.0, None]  # to the next exported call


def test_calls_are_ordered_by_arrival_when_a_session_restarts_its_numbering() -> None:
    # the proxy numbers the calls of a session that comes back after its end from 0 again
    calls = [
        call("s", 0, 0.0, 1.0, 100, 10),
        call("s", 1, 2.0, 3.0, 120, 10),
        call("s", 0, 60.0, 61.0, 140, 10),
    ]
    (session,) = calls_to_sessions(reversed(calls), {})
    assert [c.arrival_offset_s for c in session.calls] == [0.0, 2.0, 60.0]
    assert [c.call_index for c in session.calls] == [0, 1, 2]
    assert [c.tool_gap_s for c in session.calls] == [1.0, 57.0, None]


def test_mixed_models_are_an_error() -> None:
    calls = [call("s", 0, 0.0, 1.0, 100, 10), call("s", 1, 2.0, 3.0, 120, 10, model="other")]
    with pytest.raises(ExportError, match=r"session 's'.*several models.*glm-4.5-fp8, other"):
        calls_to_sessions(calls, {})
    # a failed call to another model does not count
    calls[1] = replace(calls[1], status="error")
    assert len(calls_to_sessions(calls, {})) == 1


def test_calls_without_output_are_an_error() -> None:
    with pytest.raises(ExportError, match=r"'s-0-0.0'.*0 output tokens"):
        calls_to_sessions([call("s", 0, 0.0, 1.0, 100, 0)], {})


def test_a_negative_wall_clock_latency_is_clamped() -> None:
    (session,) = calls_to_sessions([call("s", 0, 5.0, 4.5, 100, 10)], {})
    assert session.calls[0].latency_s == 0.0


def test_conversion_writes_and_reads_back(tmp_path: Path) -> None:
    sessions = calls_to_sessions(CALLS, {"b": "a"})
    path = tmp_path / "t.jsonl"
    write_trace(path, sessions)
    assert read_trace(path) == sessions


# -- parse_time ---------------------------------------------------------------------------

NOW = datetime(2026, 11, 2, 8, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30m", NOW - timedelta(minutes=30)),
        ("2h", NOW - timedelta(hours=2)),
        ("1d", NOW - timedelta(days=1)),
        ("45s", NOW - timedelta(seconds=45)),
        ("1.5h", NOW - timedelta(minutes=90)),
        (" 0m ", NOW),
        ("2026-11-01T12:00:00", T0),  # naive = UTC
        ("2026-11-01T12:00:00Z", T0),
        ("2026-11-01T14:00:00+02:00", T0),
        ("2026-11-01", datetime(2026, 11, 1, tzinfo=UTC)),
    ],
)
def test_parse_time(text: str, expected: datetime) -> None:
    parsed = parse_time(text, NOW)
    assert parsed == expected and parsed.tzinfo == UTC


def test_parse_time_takes_a_naive_or_zoned_now_as_utc() -> None:
    assert parse_time("1h", NOW.replace(tzinfo=None)) == NOW - timedelta(hours=1)
    east = NOW.astimezone(timezone(timedelta(hours=5)))
    assert parse_time("1h", east) == NOW - timedelta(hours=1)


@pytest.mark.parametrize(
    "text", ["", "yesterday", "30", "m", "-2h", "2 weeks", "3w", "1e9d", "99999999d"]
)
def test_parse_time_rejects(text: str) -> None:
    with pytest.raises(ValueError, match=r"ISO-8601.*30m, 2h, 1d"):
        parse_time(text, NOW)


# -- the query, on SQLite and PostgreSQL --------------------------------------------------


def stored(
    calls: Sequence[CallRecord],
    parents: dict[str, str] | None = None,
    agents: dict[str, str] | None = None,
) -> list[Record]:
    """Session records (with parents and agent kinds) followed by the calls, as the gateway
    writes them."""
    records: list[Record] = []
    for sid in dict.fromkeys(c.session_key for c in calls):
        first = min(c.arrived_at for c in calls if c.session_key == sid)
        model = next(c.model for c in calls if c.session_key == sid)
        parent = (parents or {}).get(sid)
        agent = (agents or {}).get(sid)
        records.append(SessionRecord(sid, "acme", model, first, first, parent, agent=agent))
    return [*records, *calls]


# "late" starts with a failed call before the "since" bound below; its first successful call
# is after it. "c" is "a"'s sub-agent.
STORED = [
    *CALLS,
    call("c", 0, 20.0, 21.0, 400, 9),
    call("c", 1, 22.5, 23.0, 420, 9),
    failed("late", 0, 29.0),
    call("late", 1, 31.0, 32.0, 80, 4),
]
PARENTS = {"b": "a", "c": "a"}
AGENTS = {"a": "claude-cli", "b": "claude-cli", "late": "qwencode"}


def ids(sessions: Sequence[SessionTrace]) -> list[str]:
    return [s.session_id for s in sessions]


@pytest.mark.asyncio
async def test_export_matches_the_conversion_and_reads_back(
    store: SqlStore, engine: AsyncEngine, tmp_path: Path
) -> None:
    await store.write_batch(stored(STORED, PARENTS, AGENTS))
    sessions = await export_trace(make_sessionmaker(engine))
    assert sessions == calls_to_sessions(STORED, PARENTS, AGENTS)
    assert ids(sessions) == ["a", "b", "c", "late"]
    assert [s.agent for s in sessions] == ["claude-cli", "claude-cli", "", "qwencode"]
    assert column(sessions, "agent")["late"] == ["qwencode"]
    assert column(sessions, "new_tokens")["a"] == EXPECTED["new_tokens"]["a"]
    assert column(sessions, "parent_session_id")["c"] == ["a", "a"]
    assert sessions[3].start_s == 31.0
    path = tmp_path / "t.jsonl"
    write_trace(path, sessions)
    assert read_trace(path) == sessions


@pytest.mark.asyncio
async def test_export_filters_whole_sessions(store: SqlStore, engine: AsyncEngine) -> None:
    await store.write_batch(stored(STORED, PARENTS))
    maker = make_sessionmaker(engine)

    async def export(**filters: object) -> list[str]:
        return ids(await export_trace(maker, **filters))  # type: ignore[arg-type]

    # "a" has calls after 1 s but starts at 0: it is left out whole, never cut
    assert await export(since=at(1.0)) == ["b", "c", "late"]
    assert await export(since=at(1.0), until=at(20.0)) == ["b"]  # until is exclusive
    assert await export(until=at(20.0 + 1e-6)) == ["a", "b", "c"]
    # by the first successful call: "late" failed at 29 s, succeeded at 31 s
    assert await export(since=at(30.0)) == ["late"]
    assert await export(until=at(30.0)) == ["a", "b", "c"]
    # naive bounds are UTC
    assert await export(since=at(30.0).replace(tzinfo=None)) == ["late"]
    assert await export(session_keys=["c", "a", "missing", "z"]) == ["a", "c"]
    assert await export(session_keys=["c"], since=at(21.0)) == []
    assert await export(session_keys=[]) == []
    # offsets count from the earliest exported call
    (only_c,) = await export_trace(maker, session_keys=["c"])
    assert [c.arrival_offset_s for c in only_c.calls] == [0.0, 2.5]


@pytest.mark.asyncio
async def test_export_of_an_empty_store(engine: AsyncEngine) -> None:
    assert await export_trace(make_sessionmaker(engine)) == []


# -- the command --------------------------------------------------------------------------

runner = CliRunner(env={"COLUMNS": "400"})  # error panels unwrapped


@pytest.fixture
def db_file(tmp_path: Path) -> str:
    """A migrated SQLite file holding STORED."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'proxy.db'}"
    migrate.upgrade(url)
    write(url, stored(STORED, PARENTS))
    return url


def write(url: str, records: Sequence[Record]) -> None:
    async def main() -> None:
        engine = make_engine(url)
        try:
            await SqlStore(make_sessionmaker(engine)).write_batch(records)
        finally:
            await engine.dispose()

    asyncio.run(main())


def test_cli_exports_to_a_file(db_file: str, tmp_path: Path) -> None:
    out = tmp_path / "trace.jsonl"
    result = runner.invoke(app, ["trace", "export", "--db", db_file, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert read_trace(out) == calls_to_sessions(STORED, PARENTS)
    assert result.stdout == ""
    assert "exported 4 sessions, 8 calls spanning 32.0 s" in result.stderr


def test_cli_writes_to_stdout_with_filters(db_file: str) -> None:
    args = ["trace", "export", "--db", db_file, "--out", "-", "--session", "c"]
    result = runner.invoke(app, [*args, "--session", "b", "--since", "2026-11-01T12:00:00.5"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["session_id"], r["call_index"]) for r in lines] == [("b", 0), ("c", 0), ("c", 1)]
    assert lines[0]["arrival_offset_s"] == 0.0 and lines[0]["ttft_s"] == 0.75
    assert "exported 2 sessions, 3 calls" in result.stderr


def test_cli_env_default_database(
    db_file: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TALARIA_DATABASE_URL", db_file)
    result = runner.invoke(app, ["trace", "export", "--out", "-", "--session", "b"])
    assert result.exit_code == 0, result.output
    assert result.stdout.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--since", "last week"], 2, "Invalid value for '--since'"),
        (["--until", "2026-13-01"], 2, "Invalid value for '--until'"),
        (["--session", "nope", "--session", "a"], 2, "session(s) nope"),
        (["--until", "2000-01-01"], 1, "no sessions to export"),
    ],
)
def test_cli_errors(db_file: str, args: list[str], code: int, message: str) -> None:
    result = runner.invoke(app, ["trace", "export", "--db", db_file, "--out", "-", *args])
    assert result.exit_code == code
    assert message in result.output
    assert result.stdout == ""


def test_cli_store_errors(db_file: str, tmp_path: Path) -> None:
    missing = f"sqlite+aiosqlite:///{tmp_path / 'missing.db'}"
    result = runner.invoke(app, ["trace", "export", "--db", missing, "--out", "-"])
    assert result.exit_code == 2 and "no SQLite database at" in result.output
    assert not (tmp_path / "missing.db").exists()
    empty = tmp_path / "empty.db"
    empty.touch()
    result = runner.invoke(
        app, ["trace", "export", "--db", f"sqlite+aiosqlite:///{empty}", "--out", "-"]
    )
    assert result.exit_code == 2 and "no such table" in result.output
    write(db_file, [call("a", 4, 10.0, 11.0, 600, 5, model="other")])
    result = runner.invoke(app, ["trace", "export", "--db", db_file, "--out", "-"])
    assert result.exit_code == 1 and "several models" in result.output
