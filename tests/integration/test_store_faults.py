"""The session store failing under a real proxy (real HTTP, real SQLite): readiness, 503s
instead of hangs, nothing lost; and the sessions' lifecycle across a restart.

Each test runs its own proxy on ``InstantRuntime`` (answers at once), so the only thing that
can be slow or fail is the store."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncGenerator
from pathlib import Path

import httpx
import pytest

from talaria.core.types import CallRequest, GenerationEvent
from talaria.proxy.contract.settings import ProxySettings
from talaria.runtime.instant import InstantRuntime
from tests.integration.server import running_proxy

ADMIN = "admin-secret-token"
MODEL = "bench-model"
AUTH = {"Authorization": f"Bearer {ADMIN}"}


def _settings(tmp: Path, **extra: object) -> ProxySettings:
    """A proxy whose shutdown gives up on a failing store after 3 s (not 30)."""
    return ProxySettings(
        **{  # type: ignore[arg-type]
            "database_url": f"sqlite+aiosqlite:///{tmp}/faults.db",
            "admin_token": ADMIN,
            "dead_letter_path": str(tmp / "dead-letters.jsonl"),
            "drain_timeout_s": 3.0,
            **extra,
        }
    )


def _chat(base: str, session: str, **headers: str) -> httpx.Response:
    return httpx.post(
        base + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        headers={"X-Talaria-Session-Id": session, **headers},
        timeout=30,
    )


def _delete_db(tmp: Path) -> None:
    for path in tmp.glob("faults.db*"):
        path.unlink()


def test_a_deleted_sqlite_file_fails_readiness_and_loses_nothing(tmp_path: Path) -> None:
    """SQLite would go on writing to the deleted file's inode, losing everything. The proxy
    notices: /readyz says so, the call whose records cannot be committed gets 503 (not a 200
    that would be lost), later calls are refused at once, admin reads fail fast, and the
    records still queued at shutdown are kept in the dead-letter file."""
    settings = _settings(tmp_path, commit_timeout_s=1.0, admin_read_timeout_s=0.5)
    with running_proxy(settings, runtimes=[InstantRuntime((MODEL,))]) as proxy:
        assert httpx.get(proxy.base_url + "/readyz").json()["ready"] is True
        assert _chat(proxy.base_url, "before").status_code == 200
        _delete_db(tmp_path)
        ready = httpx.get(proxy.base_url + "/readyz")
        assert ready.status_code == 503
        assert "deleted" in ready.json()["checks"]["store"]["error"]
        ran = _chat(proxy.base_url, "after")  # it ran; its records could not be committed
        assert ran.status_code == 503 and "not committed" in ran.json()["error"]["message"]
        refused = _chat(proxy.base_url, "refused")  # the writer is failing: refused up front
        assert refused.status_code == 503 and refused.headers["retry-after"] == "2"
        admin = httpx.get(proxy.base_url + "/admin/sessions", headers=AUTH, timeout=10)
        assert admin.status_code == 503 and "retry-after" in admin.headers
        ran_id = ran.headers["x-request-id"]
    kept = [json.loads(line) for line in (tmp_path / "dead-letters.jsonl").read_text().splitlines()]
    calls = [k["record"] for k in kept if k["kind"] == "CallRecord"]
    assert [c["request_id"] for c in calls] == [ran_id]
    assert calls[0]["status"] == "ok" and kept[0]["reason"] == "unwritten at shutdown"


def test_async_durability_answers_until_the_queue_is_full(tmp_path: Path) -> None:
    """With ``durability=async`` calls answer without waiting for the store, until the writer's
    queue reaches its bound: then 503 with Retry-After instead of growing without limit."""
    settings = _settings(tmp_path, durability="async", writer_max_pending=5)
    with running_proxy(settings, runtimes=[InstantRuntime((MODEL,))]) as proxy:
        assert _chat(proxy.base_url, "warm").status_code == 200
        _delete_db(tmp_path)
        statuses = [_chat(proxy.base_url, f"s{i}").status_code for i in range(6)]
        assert statuses[0] == 200 and statuses[-1] == 503
        assert statuses == sorted(statuses)  # once full, it stays full
        pending = httpx.get(proxy.base_url + "/readyz").json()["checks"]["store"]["pending"]
        assert pending >= 5


class GatedRuntime(InstantRuntime):
    """Holds every call until the test releases it (a call still running at shutdown)."""

    def __init__(self) -> None:
        super().__init__((MODEL,))
        self.release = threading.Event()
        self.started = threading.Event()

    async def _generate(self, request: CallRequest) -> AsyncGenerator[GenerationEvent, None]:
        self.started.set()
        while not self.release.is_set():
            await asyncio.sleep(0.01)
        async for event in super()._generate(request):
            yield event


def test_shutdown_answers_calls_in_flight_with_503_within_the_drain_timeout(
    tmp_path: Path,
) -> None:
    runtime = GatedRuntime()
    settings = _settings(tmp_path, drain_timeout_s=2.0)
    answers: list[httpx.Response] = []
    with running_proxy(settings, runtimes=[runtime]) as proxy:
        caller = threading.Thread(target=lambda: answers.append(_chat(proxy.base_url, "slow")))
        caller.start()
        assert runtime.started.wait(10)
    # leaving the block drains: the call is aborted at D - R = 1.5 s
    caller.join(10)
    assert [a.status_code for a in answers] == [503]
    assert "shutting down" in answers[0].json()["error"]["message"]
    request_id = answers[0].headers["x-request-id"]
    with running_proxy(settings, runtimes=[InstantRuntime((MODEL,))]) as proxy:
        detail = httpx.get(proxy.base_url + "/admin/sessions/slow", headers=AUTH).json()
    assert [(c["request_id"], c["status"]) for c in detail["calls"]] == [(request_id, "error")]


def test_a_restart_ends_the_sessions_left_open(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    with running_proxy(settings, runtimes=[InstantRuntime((MODEL,))]) as proxy:
        assert _chat(proxy.base_url, "open", **{"X-Talaria-Tool-Gap-Ms": "5000"}).is_success
        before = httpx.get(proxy.base_url + "/admin/sessions/open", headers=AUTH).json()
        assert before["session"]["state"] == "in_tool"
    with running_proxy(settings, runtimes=[InstantRuntime((MODEL,))]) as proxy:
        after = httpx.get(proxy.base_url + "/admin/sessions/open", headers=AUTH).json()
        assert (after["session"]["state"], after["session"]["end_reason"]) == (
            "ended",
            "restart",
        )
        assert [r["release_reason"] for r in after["reservations"]] == ["restart"]
        # the client carries on: a new session under the same id, counting from 0
        assert _chat(proxy.base_url, "open").is_success
        again = httpx.get(proxy.base_url + "/admin/sessions/open", headers=AUTH).json()
        assert again["session"]["session_key"] != after["session"]["session_key"]
        assert [c["call_index"] for c in again["calls"]] == [0]


@pytest.mark.parametrize(
    ("query", "status"),
    [("state=bogus", 400), ("state=ended", 200), ("limit=0", 400), ("started_after=x", 400)],
)
def test_admin_filters_are_validated(tmp_path: Path, query: str, status: int) -> None:
    with running_proxy(_settings(tmp_path), runtimes=[InstantRuntime((MODEL,))]) as proxy:
        response = httpx.get(proxy.base_url + "/admin/sessions?" + query, headers=AUTH)
        assert response.status_code == status, response.text
        if status == 400:
            assert "error" in response.json()


def test_requests_are_counted_by_route_and_status(tmp_path: Path) -> None:
    with running_proxy(_settings(tmp_path), runtimes=[InstantRuntime((MODEL,))]) as proxy:
        assert _chat(proxy.base_url, "m1").status_code == 200
        bad = httpx.post(proxy.base_url + "/v1/chat/completions", content=b"{")
        assert bad.status_code == 400
        httpx.get(proxy.base_url + "/no/such/path/" + "x" * 50)
        text = httpx.get(proxy.base_url + "/metrics").text
    counts = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith("talaria_requests_total{")
    }
    assert counts['talaria_requests_total{route="/v1/chat/completions",status="200"}'] == 1
    assert counts['talaria_requests_total{route="/v1/chat/completions",status="400"}'] == 1
    assert counts['talaria_requests_total{route="unmatched",status="404"}'] == 1


def test_admin_ends_a_stored_session_no_proxy_holds_live(tmp_path: Path) -> None:
    """A session the store shows open but this proxy does not hold (another process wrote
    it): the admin can still end it, and ending it twice is a 404."""
    from datetime import UTC, datetime

    from talaria.proxy.contract.records import SessionRecord
    from talaria.proxy.store.db import make_engine, make_sessionmaker
    from talaria.proxy.store.repository import SqlStore

    settings = _settings(tmp_path)
    with running_proxy(settings, runtimes=[InstantRuntime((MODEL,))]) as proxy:

        async def stored_open_session() -> None:
            engine = make_engine(str(settings.database_url))
            now = datetime.now(UTC)
            record = SessionRecord("ses_elsewhere", "acme", MODEL, now, now, state="in_tool")
            try:
                await SqlStore(make_sessionmaker(engine)).write_batch([record])
            finally:
                await engine.dispose()

        asyncio.run(stored_open_session())
        end = httpx.post(proxy.base_url + "/admin/sessions/ses_elsewhere/end", headers=AUTH)
        assert end.status_code == 200 and end.json() == {
            "session_key": "ses_elsewhere",
            "session_id": "ses_elsewhere",  # no client's id recorded: the key stands in
            "ended": True,
            "live": False,
        }
        detail = httpx.get(proxy.base_url + "/admin/sessions/ses_elsewhere", headers=AUTH).json()
        assert (detail["session"]["state"], detail["session"]["end_reason"]) == ("ended", "admin")
        again = httpx.post(proxy.base_url + "/admin/sessions/ses_elsewhere/end", headers=AUTH)
        assert again.status_code == 404
