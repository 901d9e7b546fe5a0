"""Tenants' session trees stay apart (issue 36, finding 3).

A tenant could name another tenant's session *key* (``ses_…``: sent back in
``x-talaria-session-key``) as its parent: the key was stored verbatim as
``parent_session_key`` and the admin store joined parents by key alone, so the other
tenant's family roll-up and timeline took in the intruder's calls. Now a parent is resolved
within the caller's tenant only (anything else opens a root: proxy/sessions/resolve.py), and
the admin store joins a parent by key *and* tenant (proxy/store/sessions.py), which also
keeps rows written before the fix apart.

The property: no sequence of calls, hints and ends by tenant B changes any admin view of
tenant A (its session list, each session's detail and children, each family's roll-up),
whatever B names — A's client ids, A's keys, A's conversations.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import tempfile
from collections.abc import Awaitable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from talaria.core.calls import Call, ToolChoice, ToolSpec
from talaria.core.catalog import load_catalog
from talaria.core.clock import LoopClock, run_virtual
from talaria.proxy.callpath.gateway import CallPath, call_path
from talaria.proxy.contract.calls import PreparedCall
from talaria.proxy.contract.identity import Identity
from talaria.proxy.contract.metrics import ProxyMetrics
from talaria.proxy.contract.records import Record, SessionRecord
from talaria.proxy.runtimes.embedded import InProcessRuntime
from talaria.proxy.store.db import make_engine, make_sessionmaker
from talaria.proxy.store.migrate import upgrade_async
from talaria.proxy.store.repository import SqlStore
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import TALARIA
from talaria.runtime.sim_node import NodeSetup, build_sim_node
from tests.store.test_store_repository import T0, call, session
from tests.support import ListSink

MODEL = "glm-4.5-fp8"
REQUEST_NUMBERS = itertools.count()
BASH = ToolSpec("bash", "run a command", {"type": "object", "properties": {}})


def _call(
    tenant: str,
    task: str,
    steps: int,
    sid: str | None,
    parent: str | None = None,
    tools: bool = True,
    system: str | None = None,
) -> PreparedCall:
    """Step ``steps`` of an agent's conversation on ``task`` (each continues the one
    before): the task, then ``steps`` tool rounds."""
    messages: list[dict[str, object]] = []
    if system is not None:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": task * 20})
    for k in range(steps):
        fn = {"name": "bash", "arguments": "{}"}
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": f"c{k}", "type": "function", "function": fn}]})  # fmt: skip
        messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": f"out {k}"})
    source = "talaria" if sid is not None else "implicit"
    return PreparedCall(
        request_id=f"{tenant}-{next(REQUEST_NUMBERS)}",
        tenant_id=tenant,
        identity=Identity(sid, source, parent, None, False),
        api="chat",
        content=Call(
            model=MODEL,
            messages=tuple(messages),
            tools=(BASH,) if tools else (),
            tool_choice=ToolChoice("required") if tools else ToolChoice("auto"),
        ),
        max_tokens=16,
    )


A_AGENTS = (
    ("fix the parser ", "a-main", None),  # a named root
    ("write the docs ", None, None),  # an implicit root
    ("explore the repo ", "a-sub", "a-main"),  # a child of a-main
)
"""Tenant A's agents: (task, client id, parent's client id)."""

B_ACTIONS = st.sampled_from(
    [
        "parent-key",  # B's sub-agent names A's session key as its parent
        "parent-id",  # ... or A's client id
        "same-id",  # B names its own session with A's client id
        "copy",  # B replays A's conversation, implicitly
        "side",  # an implicit side call of B while A's call waits
        "hint",  # a tool-gap hint for A's client id
        "end",  # ends A's client id
    ]
)


async def _drive(
    path: CallPath, plan: list[tuple[int, list[tuple[str, int]]]], with_b: bool
) -> None:
    """A's steps in ``plan`` order; with ``with_b``, B's actions run while each step's call
    is in flight."""
    steps = [0] * len(A_AGENTS)
    a_keys: list[str] = []
    b_count = 0
    for agent, b_actions in plan:
        task, sid, parent = A_AGENTS[agent]
        handle = await path.gateway.open_call(_call("A", task, steps[agent], sid, parent))
        steps[agent] += 1
        if handle.session_key not in a_keys:
            a_keys.append(handle.session_key)
        pending: list[Awaitable[Any]] = []
        for action, target in b_actions if with_b else ():
            b_count += 1
            key = a_keys[target % len(a_keys)]
            a_id = ("a-main", "a-sub")[target % 2]
            b_sid = f"b-{b_count}"
            if action in ("parent-key", "parent-id", "same-id", "copy", "side"):
                b_call = {
                    "parent-key": _call("B", "intrude ", 0, b_sid, parent=key),
                    "parent-id": _call("B", "intrude ", 0, b_sid, parent=a_id),
                    "same-id": _call("B", task, 0, a_id),
                    "copy": _call("B", task, max(0, steps[agent] - 1), None),
                    "side": _call("B", "title ", 0, None, tools=False, system="Write a title."),
                }[action]
                pending.append((await path.gateway.open_call(b_call)).outcome())
            elif action == "hint":
                await path.keeper.hint(a_id, "B", 5.0, "bash")
                await path.keeper.hint(key, "B", 5.0, "bash")
            else:
                await path.keeper.end_session(a_id, "client", "B")
                await path.keeper.end_session(key, "client", "B")
        await handle.outcome()
        await asyncio.gather(*pending)


def _run(plan: list[tuple[int, list[tuple[str, int]]]], with_b: bool) -> list[Record]:
    sink = ListSink()

    async def main() -> None:
        clock = LoopClock()
        node = build_sim_node(
            "n0", NodeSetup("h200x8", "default", (MODEL,)), load_catalog(), TALARIA,
            SchedulerConfig(), clock,
        )  # fmt: skip
        runtime = InProcessRuntime(node, clock, status_ttl_s=0.0)
        await runtime.start()
        path = call_path([runtime], sink, ProxyMetrics(), clock)
        path.gateway.start()
        try:
            await _drive(path, plan, with_b)
        finally:
            await path.gateway.close()
            await runtime.close()

    run_virtual(main())
    return sink.records


async def _views(store: SqlStore, tenant: str, order: dict[str, int]) -> dict[str, Any]:
    """Every admin view of ``tenant``, with its session keys renamed by ``order`` (the order
    they first appear in) and without wall times."""

    def n(key: str | None) -> str | None:
        return None if key is None else f"#{order[key]}" if key in order else key

    roots = await store.sessions.list_sessions(tenant_id=tenant, limit=1000)
    everyone = await store.sessions.list_sessions(tenant_id=tenant, limit=1000, roots=False)
    families = await store.sessions.families([s.session_key for s in roots.items])
    details = {}
    for s in everyone.items:
        detail = await store.sessions.get_session(s.session_key, tenant)
        assert detail is not None
        details[n(s.session_key)] = (
            n(detail.session.session_id),  # an implicit session's id is its key
            n(detail.session.parent_session_key),
            detail.session.state,
            detail.session.calls,
            [c.call_index for c in detail.calls],
            sorted(n(c.session_key) for c in detail.children),
        )
    return {
        "roots": sorted(n(s.session_key) for s in roots.items),
        "families": {n(k): (f.sessions, f.calls) for k, f in families.items()},
        "details": details,
    }


def _order(records: list[Record], tenant: str) -> dict[str, int]:
    order: dict[str, int] = {}
    for r in records:
        if isinstance(r, SessionRecord) and r.tenant_id == tenant:
            order.setdefault(r.session_key, len(order))
    return order


async def _admin_views_of_a(template: Path, records: list[Record]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        db = Path(d) / "store.db"
        shutil.copy(template, db)
        engine = make_engine(f"sqlite+aiosqlite:///{db}")
        try:
            store = SqlStore(make_sessionmaker(engine))
            await store.write_batch(records)
            return await _views(store, "A", _order(records, "A"))
        finally:
            await engine.dispose()


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty store migrated to head, copied for each example."""
    path = tmp_path_factory.mktemp("trees") / "template.db"
    asyncio.run(upgrade_async(f"sqlite+aiosqlite:///{path}"))
    return path


PLANS = st.lists(
    st.tuples(
        st.integers(0, len(A_AGENTS) - 1),
        st.lists(st.tuples(B_ACTIONS, st.integers(0, 5)), max_size=3),
    ),
    min_size=2,
    max_size=8,
).map(lambda plan: [(0, []), *plan])  # a-main first: the sub-agent's parent is live


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plan=PLANS)
def test_no_calls_of_another_tenant_change_any_admin_view(
    template: Path, plan: list[tuple[int, list[tuple[str, int]]]]
) -> None:
    alone = asyncio.run(_admin_views_of_a(template, _run(plan, with_b=False)))
    beside_b = asyncio.run(_admin_views_of_a(template, _run(plan, with_b=True)))
    assert beside_b == alone


def test_another_tenants_key_as_parent_opens_a_root() -> None:
    """The finding as reported: B names A's key; B's session is a root of B's, A's family
    has only A's sessions."""

    async def scenario(path: CallPath) -> None:
        a = await path.gateway.open_call(_call("A", "fix ", 0, "a-main"))
        await a.outcome()
        b = await path.gateway.open_call(_call("B", "intrude ", 0, "b-1", parent=a.session_key))
        assert b.how == "new"
        await b.outcome()
        b_state = path.keeper.sessions.get(b.session_key)
        assert b_state is not None and b_state.parent_key is None and b_state.is_root
        assert path.keeper.sessions.children(a.session_key) == []

    sink = ListSink()

    async def main() -> None:
        clock = LoopClock()
        node = build_sim_node(
            "n0", NodeSetup("h200x8", "default", (MODEL,)), load_catalog(), TALARIA,
            SchedulerConfig(), clock,
        )  # fmt: skip
        runtime = InProcessRuntime(node, clock, status_ttl_s=0.0)
        await runtime.start()
        path = call_path([runtime], sink, ProxyMetrics(), clock)
        try:
            await scenario(path)
        finally:
            await path.gateway.close()
            await runtime.close()

    run_virtual(main())
    b_rows = [r for r in sink.records if isinstance(r, SessionRecord) and r.tenant_id == "B"]
    assert b_rows and all(r.parent_session_key is None for r in b_rows)


@pytest.mark.asyncio
async def test_a_stored_cross_tenant_parent_joins_nothing(store: SqlStore) -> None:
    """A row written before the fix (B's session with A's key as its parent) stays out of
    A's children, family and timeline, and is one of B's roots."""
    await store.write_batch(
        [
            session("ses_a", tenant_id="A", session_id="a-main"),
            call("rA", "ses_a", 0),
            session("ses_b", tenant_id="B", session_id="b-1", parent_session_key="ses_a"),
            call("rB", "ses_b", 0),
            call("rB2", "ses_b", 1, arrived_at=T0 + timedelta(seconds=5)),
        ]
    )
    detail = await store.sessions.get_session("ses_a", "A")
    assert detail is not None and detail.children == ()
    families = await store.sessions.families(["ses_a"])
    assert (families["ses_a"].sessions, families["ses_a"].calls) == (1, 1)
    b_roots = await store.sessions.list_sessions(tenant_id="B")
    assert [s.session_key for s in b_roots.items] == ["ses_b"]
