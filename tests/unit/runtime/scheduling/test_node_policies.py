"""The node's scheduling policies as objects (runtime/scheduling/policies/, issue 47 item 1):
composed once from a named policy, the only readers of the flags; a new queue order is a
class and a table line; what a policy keeps per session goes with the session.

On the virtual-time loop with simulated engines; seeded where random.
"""

from __future__ import annotations

import ast
import asyncio
from collections.abc import Iterator, Sequence

import pytest

from talaria.core.catalog import load_catalog
from talaria.core.clock import LoopClock, run_virtual
from talaria.core.types import CallRequest, Priority
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import (
    FLAG_NAMES,
    ROUND,
    TALARIA,
    SchedulerFlags,
    policy_flags,
)
from talaria.runtime.scheduling.node import NodeScheduler
from talaria.runtime.scheduling.policies import compose
from talaria.runtime.scheduling.policies.compose import PolicyChoice
from talaria.runtime.scheduling.policies.planner import CoResidentPlanner, DemandPlanner
from talaria.runtime.scheduling.policies.queue import ArrivalOrder, FairOrder, QueueOrder
from talaria.runtime.scheduling.state import WaitingCall
from talaria.runtime.sim_node import NodeSetup, build_sim_node
from tests.support import REPO_ROOT

GLM = "glm-4.5-fp8"
CATALOG = load_catalog()


def _built(policy: PolicyChoice | SchedulerFlags) -> NodeScheduler:
    setup = NodeSetup("h200x8", "default", (GLM,))
    return build_sim_node("n0", setup, CATALOG, policy, SchedulerConfig(), LoopClock())


def _node(policy: PolicyChoice | SchedulerFlags = TALARIA) -> NodeScheduler:
    """A started node (on the running loop)."""
    node = _built(policy)
    node.start()
    return node


@pytest.mark.parametrize(
    ("name", "queue", "planner", "holds"),
    [
        ("round", "arrival", "round-robin", "none"),
        ("talaria", "fair", "demand+co-residency", "mean-gap"),
        ("talaria-learned", "fair", "demand+co-residency", "learned-gap"),
        ("+demand_slots", "arrival", "demand", "none"),
        ("+co_residency", "arrival", "round-robin+co-residency", "none"),
        ("-demand_slots", "fair", "round-robin+co-residency", "mean-gap"),
        ("+soft_reservations", "arrival", "round-robin", "mean-gap"),
        ("+learned_gaps", "arrival", "round-robin", "none"),  # learned gaps hold nothing alone
        ("-fair_queue", "arrival", "demand+co-residency", "mean-gap"),
    ],
)
def test_each_named_policy_is_one_composition(
    name: str, queue: str, planner: str, holds: str
) -> None:
    choice = PolicyChoice.of(policy_flags(name))
    assert (choice.queue, choice.planner, choice.holds) == (queue, planner, holds)
    flags = policy_flags(name)
    assert (choice.session_prefill, choice.kv_on_host, choice.stage_weights) == (
        flags.sp_admission,
        flags.host_kv,
        flags.d2d_staging,
    )
    assert choice.evicts_by_class == (queue == "fair")


def test_the_objects_are_built_once_per_node_from_the_choice() -> None:
    talaria, plain = _built(TALARIA), _built(ROUND)
    assert isinstance(talaria.policies.queue, FairOrder)
    assert isinstance(talaria.policies.planner, CoResidentPlanner)
    assert isinstance(talaria.policies.planner.inner, DemandPlanner)
    assert isinstance(plain.policies.queue, ArrivalOrder)
    assert talaria.policies.queue is not _built(TALARIA).policies.queue  # per node, not shared


def test_an_unknown_choice_names_the_kind_and_the_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown queue order 'lifo'; choose from: arrival, fair"):
        PolicyChoice(queue="lifo")


class LatestFirst(QueueOrder):
    """A toy queue order: the latest arrival first. It hears the node's events too: the calls
    admitted, in the order of admission."""

    name = "latest-first"

    def __init__(self) -> None:
        self.asked: list[list[str]] = []
        self.admitted: list[str] = []

    def order(self, queue: Sequence[WaitingCall], now_s: float) -> Iterator[WaitingCall]:
        self.asked.append([w.request.request_id for w in queue])
        return iter(list(reversed(queue)))

    def call_admitted(self, request: CallRequest, estimate_s: float) -> None:
        self.admitted.append(request.request_id)


def test_a_new_queue_order_is_a_class_and_one_table_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """The toy order is chosen by name and decides the order of the admission pass: calls that
    queue while the model is being switched in are admitted latest first."""
    monkeypatch.setitem(compose.QUEUE_ORDERS, "latest-first", lambda _a, _c: LatestFirst())

    async def main() -> LatestFirst:
        node = _node(PolicyChoice(queue="latest-first"))
        requests = [CallRequest(f"r{i}", f"s{i}", GLM, 4000, 20) for i in range(4)]
        await asyncio.gather(*(node.submit(r) for r in requests))
        await node.stop()
        assert isinstance(node.policies.queue, LatestFirst)
        return node.policies.queue

    toy = run_virtual(main())
    assert toy.asked[0] == ["r0", "r1", "r2", "r3"]  # the first pass, once the model is in
    assert toy.admitted == ["r3", "r2", "r1", "r0"]


def test_ten_thousand_ended_sessions_leave_no_state_in_the_fair_queue() -> None:
    """Two tenants of two classes (so the fair order's every rule runs); every session calls
    twice and ends. Nothing per session is left: no entry, KV, reservation or account."""

    async def main() -> tuple[set[str], int, int]:
        node = _node(TALARIA)
        for batch in range(50):
            keys = [f"s{batch}-{i}" for i in range(200)]
            for turn in range(2):
                await asyncio.gather(
                    *(
                        node.submit(
                            CallRequest(
                                f"{key}-{turn}", key, GLM, 300 + 50 * turn, 4,
                                tenant="a" if i % 2 else "b",
                                priority=Priority.INTERACTIVE if i % 2 else Priority.BATCH,
                            )
                        )
                        for i, key in enumerate(keys)
                    )
                )  # fmt: skip
            for key in keys:
                node.end_session(key)
        accounts = node.policies.queue.accounts  # type: ignore[attr-defined]
        left = node.session_keys(), len(accounts.attained), len(accounts.vtime)
        await node.stop()
        return left

    keys, attained, tenants = run_virtual(main())
    assert keys == set() and attained == 0
    assert tenants == 2  # what a tenant was served stays: tenants are few and long-lived


FLAG_READERS = {
    "runtime/scheduling/flags.py",  # the names' grammar
    "runtime/scheduling/policies/compose.py",  # the table of compositions
}


def _flag_reads() -> Iterator[str]:
    for folder in ("core", "runtime", "proxy", "sim", "sdk", "talaria", "bench"):
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            rel = path.relative_to(REPO_ROOT).as_posix()
            if rel in FLAG_READERS or path.is_symlink():
                continue
            for node in ast.walk(ast.parse(path.read_text(), rel)):
                if isinstance(node, ast.Attribute) and node.attr in FLAG_NAMES:
                    yield f"{rel}:{node.lineno} .{node.attr}"


def test_no_code_outside_the_policy_definitions_reads_a_flag() -> None:
    assert list(_flag_reads()) == []
