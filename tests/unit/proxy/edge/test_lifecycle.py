"""The app's small service container (proxy/edge/lifecycle.py): services start after what they
need, in the declared order among those ready; they stop in the reverse order; a failed start
stops what started before it; a need never declared, or a cycle, is refused."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from talaria.proxy.edge.lifecycle import Lifecycle, Parts


def _service(log: list[str], name: str, fail: bool = False) -> tuple[
    Callable[[Parts], Awaitable[str]], Callable[[object], Awaitable[None]]
]:  # fmt: skip
    async def start(parts: Parts) -> str:
        if fail:
            raise RuntimeError(f"{name} cannot start")
        log.append(f"start {name}")
        return f"part of {name}"

    async def stop(part: object) -> None:
        assert part == f"part of {name}"
        log.append(f"stop {name}")

    return start, stop


def _declared(log: list[str], failing: str | None = None) -> Lifecycle:
    life = Lifecycle()
    for name, needs in [
        ("gateway", ("store", "runtimes")),
        ("store", ()),
        ("runtimes", ("catalog",)),
        ("catalog", ()),
        ("cluster", ("store", "gateway")),
    ]:
        start, stop = _service(log, name, fail=name == failing)
        life.add(name, start, stop, needs=needs)
    return life


def test_services_start_after_what_they_need_and_stop_in_reverse() -> None:
    log: list[str] = []
    life = _declared(log)
    parts = asyncio.run(life.start())
    assert log == ["start store", "start catalog", "start runtimes", "start gateway",
                   "start cluster"]  # fmt: skip
    assert parts.get("gateway", str) == "part of gateway"
    asyncio.run(life.stop())
    assert log[5:] == ["stop cluster", "stop gateway", "stop runtimes", "stop catalog",
                       "stop store"]  # fmt: skip


def test_a_failed_start_stops_what_started_before_it() -> None:
    log: list[str] = []
    life = _declared(log, failing="gateway")
    with pytest.raises(RuntimeError, match="gateway cannot start"):
        asyncio.run(life.start())
    assert log == ["start store", "start catalog", "start runtimes",
                   "stop runtimes", "stop catalog", "stop store"]  # fmt: skip


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        ([("a", ("b",))], "needs undeclared"),
        ([("a", ("b",)), ("b", ("a",))], "need each other"),
    ],
)
def test_a_missing_need_or_a_cycle_is_refused(
    declared: list[tuple[str, tuple[str, ...]]], message: str
) -> None:
    life = Lifecycle()
    for name, needs in declared:
        start, stop = _service([], name)
        life.add(name, start, stop, needs=needs)
    with pytest.raises(ValueError, match=message):
        life.order()


def test_a_part_of_the_wrong_kind_is_a_type_error() -> None:
    parts = Parts()
    parts.put("store", "a string")
    assert parts.optional("cluster", int) is None  # none declared: no part
    with pytest.raises(TypeError):
        parts.get("store", int)
