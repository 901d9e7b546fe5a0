"""proxy/placement/loop.py and moves.py: the controller's looks at live runtimes and the moves
it makes over their API, on a virtual clock with runtimes that keep their models in memory."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from talaria.core.clock import LoopClock, TimeScale, run_virtual
from talaria.core.placement import MoveKind, PlacementConfig, Reason
from talaria.core.status import InstanceStatus, ModelResidency, ModelState
from talaria.proxy.placement.library import FleetDemand, load_library
from talaria.proxy.placement.loop import ColdStartFailed, PlacementLoop
from talaria.proxy.runtimes.decoding import PlacementRefused
from talaria.proxy.runtimes.pool import RuntimePool

GB = 1e9
ENGINE_START_S = 40.0


class FakeRuntime:
    """A runtime server's placement API in memory: an add takes ``ENGINE_START_S`` of the
    clock (an engine's start), or fails as ``fail_add`` says."""

    kind = "http"
    address = None

    def __init__(
        self,
        name: str,
        models: Sequence[str],
        *,
        budget: float = 1_000 * GB,
        fail_add: str | None = None,
        add_s: float = ENGINE_START_S,
        gpus: int | None = None,
    ) -> None:
        self.name = name
        self.server: str | None = "h200x8" if gpus is not None else None
        self.gpus = gpus
        self.hosted = list(models)
        self.draining: set[str] = set()
        self.live: dict[str, int] = {}
        self.weight_budget_bytes = budget
        self.quantum_s: float | None = 30.0
        self.fail_add = fail_add
        self.add_s = add_s
        self.requests: list[tuple[str, Any]] = []
        self.sessions: dict[str, float] = {}
        """Model → sessions with a call in the window (its demand document)."""
        self.calls: dict[str, tuple[int, float]] = {}
        """Model → (calls finished in the window, their mean engine seconds)."""
        self.demand_fails = False
        self.idle_s: dict[str, float] = {}
        self.gap_p99_s: dict[str, float] = {}

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(self.hosted)

    @property
    def draining_models(self) -> frozenset[str]:
        return frozenset(self.draining)

    @property
    def context_windows(self) -> Mapping[str, int]:
        return {}

    async def status(self) -> InstanceStatus:
        return InstanceStatus(
            instance=self.name,
            at_s=0.0,
            active_model=None,
            models={
                m: ModelResidency(
                    m, ModelState.HOST, 0.0, live_sessions=self.live.get(m, 0), switch_s=2.0
                )
                for m in self.hosted
            },
        )

    async def demand(self, window_s: float) -> Mapping[str, Any]:
        if self.demand_fails:
            raise RuntimeError("demand unreachable")
        return {
            "window_s": window_s,
            "demand": dict(self.sessions),
            "call_s": {m: mean for m, (_, mean) in self.calls.items()},
            "finished_calls": {m: n for m, (n, _) in self.calls.items()},
            "idle_s": dict(self.idle_s),
            "gap_p99_s": dict(self.gap_p99_s),
        }

    async def add_model(self, entry: Mapping[str, Any]) -> None:
        self.requests.append(("add", dict(entry)))
        await asyncio.sleep(self.add_s)
        if self.fail_add is not None:
            raise PlacementRefused(self.fail_add, 500)
        self.hosted.append(entry["name"])

    async def drain_model(self, name: str) -> None:
        self.requests.append(("drain", name))
        self.draining.add(name)

    async def remove_model(self, name: str) -> None:
        self.requests.append(("remove", name))
        if name not in self.hosted:
            raise PlacementRefused(f"model {name!r} is not on this node", 404)
        if len(self.hosted) == 1:
            raise PlacementRefused(f"model {name!r} is this node's last model", 409)
        self.hosted.remove(name)
        self.draining.discard(name)


LIBRARY = {
    "a": {"name": "a", "engine": "sim"},
    "b": {"name": "b", "engine": "sim"},
    "c": {"name": "c", "engine": "vllm", "path": "/models/c", "weight_bytes": 300 * GB},
}
CATALOG_WEIGHTS = {"a": 200 * GB, "b": 200 * GB, "outside": 100 * GB}


def _loop(
    runtimes: Sequence[FakeRuntime],
    *,
    config: PlacementConfig | None = None,
    library: Mapping[str, Mapping[str, Any]] = LIBRARY,
    timeout_s: float = 900.0,
    leads: bool = True,
    floors: Mapping[str, int] | None = None,
) -> PlacementLoop:
    pool = RuntimePool(runtimes, TimeScale(1.0))  # type: ignore[arg-type]
    return PlacementLoop(
        pool,
        library,
        CATALOG_WEIGHTS,
        config or PlacementConfig(),
        LoopClock(),
        leads=lambda: leads,
        cold_start_timeout_s=timeout_s,
        group_floor=lambda model, server: (floors or {}).get(model),
    )


def test_a_call_for_a_library_model_cold_starts_it_with_its_entry() -> None:
    async def main() -> None:
        n0, n1 = FakeRuntime("n0", ["a"]), FakeRuntime("n1", ["b"])
        loop = _loop([n0, n1])
        start = asyncio.get_running_loop().time()
        assert await loop.ensure("c") is True
        assert asyncio.get_running_loop().time() - start == pytest.approx(ENGINE_START_S)
        hosts = [r for r in (n0, n1) if "c" in r.models]
        assert len(hosts) == 1
        # the entry as the library gives it, less the controller's own key
        assert hosts[0].requests == [("add", {"name": "c", "engine": "vllm", "path": "/models/c"})]
        [record] = loop.moves.records
        assert (record.kind, record.model, record.reason, record.outcome) == (
            "add",
            "c",
            "cold-start",
            "ok",
        )
        assert record.seconds == pytest.approx(ENGINE_START_S)
        assert await loop.ensure("c") is True  # hosted now: no second add
        assert sum(len(r.requests) for r in (n0, n1)) == 1

    run_virtual(main())


def test_a_model_is_never_added_to_a_gpu_group_too_small_for_it() -> None:
    """c needs a group of 4 GPUs: the idle 2-GPU runtime is passed over for the busier
    4-GPU one; a runtime that does not say its group is not constrained."""

    async def main() -> None:
        small, big = FakeRuntime("small", [], gpus=2), FakeRuntime("big", ["a", "b"], gpus=4)
        loop = _loop([small, big], floors={"c": 4, "a": 1, "b": 1})
        assert await loop.ensure("c") is True
        assert "c" in big.models and "c" not in small.models
        only = FakeRuntime("only", [], gpus=2)
        loop = _loop([only], floors={"c": 4})
        with pytest.raises(ColdStartFailed, match="no runtime has room for c"):  # its 503
            await loop.ensure("c")
        assert only.requests == []
        unsaid = FakeRuntime("unsaid", [])
        assert await _loop([unsaid], floors={"c": 4}).ensure("c") is True

    run_virtual(main())


def test_calls_waiting_for_the_same_cold_model_share_one_add() -> None:
    async def main() -> None:
        n0 = FakeRuntime("n0", ["a"])
        loop = _loop([n0])
        assert await asyncio.gather(*(loop.ensure("c") for _ in range(5))) == [True] * 5
        assert [kind for kind, _ in n0.requests] == ["add"]

    run_virtual(main())


def test_a_model_outside_the_library_is_left_to_the_404() -> None:
    async def main() -> None:
        n0 = FakeRuntime("n0", ["a"])
        loop = _loop([n0])
        assert await loop.ensure("outside") is False
        assert n0.requests == [] and loop.moves.records == []

    run_virtual(main())


@pytest.mark.parametrize(
    ("runtime", "timeout_s", "message"),
    [
        (
            FakeRuntime("n0", ["a"], fail_add="engine did not start: NoSuchForCausalLM"),
            900.0,
            "NoSuchForCausalLM",
        ),
        (FakeRuntime("n0", ["a"], budget=250 * GB), 900.0, "no runtime has room for c"),
        (FakeRuntime("n0", ["a"], add_s=2_000.0), 900.0, "not placed within 900 s"),
    ],
    ids=["engine-fails", "no-room", "too-slow"],
)
def test_a_cold_start_that_cannot_be_made_fails_the_waiting_call(
    runtime: FakeRuntime, timeout_s: float, message: str
) -> None:
    async def main() -> None:
        loop = _loop([runtime], timeout_s=timeout_s)
        with pytest.raises(ColdStartFailed, match=message):
            await loop.ensure("c")
        assert "c" not in runtime.models

    run_virtual(main())


def test_a_redundant_replica_is_drained_then_removed_once_its_sessions_end() -> None:
    async def main() -> None:
        n0, n1 = FakeRuntime("n0", ["a", "b"]), FakeRuntime("n1", ["a"])
        n0.live = {"a": 2}
        n0.sessions, n1.sessions = {"a": 1, "b": 30}, {"a": 1}  # a: 2 in all
        loop = _loop([n0, n1])
        moves = await loop.look()
        assert [(m.kind, m.model, m.node, m.reason) for m in moves] == [
            (MoveKind.DRAIN, "a", "n0", Reason.SCALE_IN)
        ]
        await asyncio.sleep(100.0)
        assert n0.requests == [("drain", "a")]  # its two sessions still live there
        assert n0.draining_models == {"a"} and "a" in n0.models
        n0.live = {}
        await asyncio.sleep(20.0)  # the drain's next look at the runtime
        assert n0.requests == [("drain", "a"), ("remove", "a")]
        assert n0.models == ("b",) and loop.moves.records[0].outcome == "ok"

    run_virtual(main())


def test_a_drain_whose_sessions_stay_ends_after_drain_s() -> None:
    async def main() -> None:
        n0, n1 = FakeRuntime("n0", ["a", "b"]), FakeRuntime("n1", ["a"])
        n0.live = {"a": 1}
        config = PlacementConfig(drain_s=120.0)
        n0.sessions = {"a": 1, "b": 30}
        loop = _loop([n0, n1], config=config)
        await loop.look()
        await asyncio.sleep(119.0)
        assert "a" in n0.models
        await asyncio.sleep(20.0)
        assert n0.models == ("b",)

    run_virtual(main())


def test_a_drain_no_replica_carries_out_is_taken_over_and_ends() -> None:
    """A library model left draining (the replica that began the drain has gone) is removed
    by the next looker once its sessions end; a second look does not take it over twice."""

    async def main() -> None:
        n0, n1 = FakeRuntime("n0", ["a", "b"]), FakeRuntime("n1", ["a"])
        n0.draining, n0.live = {"a"}, {"a": 1}
        loop = _loop([n0, n1])
        assert await loop.look() == []  # no demand: the controller itself moves nothing
        await loop.look()
        assert [(r.kind, r.model, r.runtime, r.reason) for r in loop.moves.records] == [
            ("drain", "a", "n0", "taken-over")
        ]
        n0.live = {}
        await asyncio.sleep(20.0)
        assert n0.models == ("b",) and loop.moves.records[0].outcome == "ok"
        await loop.look()
        assert len(loop.moves.records) == 1

    run_virtual(main())


def test_a_drain_whose_model_another_replica_removed_ends_ok() -> None:
    async def main() -> None:
        n0, n1 = FakeRuntime("n0", ["a", "b"]), FakeRuntime("n1", ["a"])
        n0.draining, n0.live = {"a"}, {"a": 1}
        loop = _loop([n0, n1])
        await loop.look()
        n0.hosted.remove("a")  # removed meanwhile by the replica that began the drain
        n0.draining.clear()
        await asyncio.sleep(PlacementConfig().drain_s + 20.0)
        assert n0.requests[-1] == ("remove", "a")
        assert loop.moves.records[0].outcome == "ok"

    run_virtual(main())


def test_a_removal_the_runtime_refuses_is_not_taken_over_again() -> None:
    async def main() -> None:
        n0, n1 = FakeRuntime("n0", ["a"]), FakeRuntime("n1", ["a"])
        n0.draining = {"a"}
        loop = _loop([n0, n1], config=PlacementConfig(drain_s=30.0))
        await loop.look()
        await asyncio.sleep(60.0)
        assert loop.moves.records[0].outcome.startswith("failed") and "last model" in (
            loop.moves.records[0].outcome
        )
        await loop.look()
        assert len(loop.moves.records) == 1

    run_virtual(main())


def test_the_view_counts_adds_under_way_and_not_draining_models() -> None:
    async def main() -> None:
        n0, n1 = FakeRuntime("n0", ["a", "b", "outside"]), FakeRuntime("n1", ["b"])
        n0.draining = {"b"}
        n0.live = {"b": 3}
        loop = _loop([n0, n1])
        loop.moves.adding[("n1", "c")] = 0.0  # an add started by this loop
        statuses = {s.instance: s for s in await loop.pool.statuses(None)}
        view = loop.view(0.0, statuses, FleetDemand({}, {}, {}, {}))
        nodes = {n.name: n for n in view.nodes}
        assert nodes["n0"].hosted == {"a", "outside"} and nodes["n0"].draining == {"b"}
        assert nodes["n0"].live["b"] == 3 and nodes["n0"].budget_bytes == 1_000 * GB
        assert nodes["n1"].hosted == {"b", "c"}
        assert view.weight_bytes["c"] == 300 * GB  # the library's figure
        assert view.weight_bytes["a"] == 200 * GB  # the catalog's
        assert view.weight_bytes["outside"] == 100 * GB
        assert view.switch_s["a"] == 2.0 and view.quantum_s == 30.0

    run_virtual(main())


def test_moves_of_models_outside_the_library_are_not_made() -> None:
    async def main() -> None:
        n0, n1 = FakeRuntime("n0", ["outside", "b"]), FakeRuntime("n1", ["outside"])
        n0.sessions = {"outside": 1, "b": 30}
        loop = _loop([n0, n1])
        assert await loop.look() == []  # the scale-in of "outside" would be the move
        assert n0.requests == [] and loop.moves.records == []

    run_virtual(main())


@pytest.mark.parametrize(("leads", "looks"), [(True, 3), (False, 0)])
def test_only_the_leading_replica_looks(leads: bool, looks: int) -> None:
    async def main() -> None:
        loop = _loop([FakeRuntime("n0", ["a"])], leads=leads)
        loop.start()
        await asyncio.sleep(3 * loop.config.interval_s + 1)
        await loop.close()
        assert loop.looks == looks

    run_virtual(main())


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "no \\[\\[model\\]\\] entries"),
        ('[[model]]\nengine = "sim"\n', "needs a name"),
        ('[[model]]\nname = "a"\n[[model]]\nname = "a"\n', "listed twice"),
        ('[[model]]\nname = "a"\nweight_bytes = -1\n', "weight_bytes"),
        ("[[model]\n", "model library"),
    ],
)
def test_a_bad_library_is_refused_with_what_is_wrong(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "library.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=error):
        load_library(path)


def test_a_library_lists_its_entries_by_name(tmp_path: Path) -> None:
    path = tmp_path / "library.toml"
    path.write_text(
        '[[model]]\nname = "a"\nengine = "sim"\n\n[[model]]\nname = "c"\n'
        'engine = "vllm"\npath = "tiny-llama-b"\nmax_model_len = 2048\n'
    )
    assert load_library(path) == {
        "a": {"name": "a", "engine": "sim"},
        "c": {"name": "c", "engine": "vllm", "path": "tiny-llama-b", "max_model_len": 2048},
    }
    assert load_library(str(path)) == load_library(path)


def test_a_look_that_fails_fails_the_cold_start_with_its_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def main() -> None:
        loop = _loop([FakeRuntime("n0", ["a"])])

        def broken(*_: object) -> list[object]:
            raise ValueError("a view the controller cannot read")

        monkeypatch.setattr("talaria.proxy.placement.loop.decide", broken)
        with pytest.raises(ColdStartFailed, match="cannot read"):
            await loop.ensure("c")

    run_virtual(main())


def test_runtimes_that_cannot_place_are_refused_at_start() -> None:
    class Embedded:
        name, kind = "in-process-0", "in-process"

    with pytest.raises(ValueError, match="runtime servers reached over HTTP"):
        PlacementLoop(
            RuntimePool([Embedded()], TimeScale(1.0)),  # type: ignore[list-item]
            LIBRARY,
            {},
            PlacementConfig(),
            LoopClock(),
        )


def test_demand_is_summed_over_the_runtimes_and_call_times_weighted_by_their_calls() -> None:
    async def main() -> None:
        n0, n1, n2 = (
            FakeRuntime("n0", ["a"]),
            FakeRuntime("n1", ["a", "b"]),
            FakeRuntime("n2", ["b"]),
        )
        n0.sessions, n1.sessions = {"a": 3}, {"a": 2, "b": 1}
        n0.calls, n1.calls = {"a": (1, 10.0)}, {"a": (3, 2.0), "b": (2, 5.0)}
        n0.idle_s, n0.gap_p99_s = {"a": 70.0}, {"a": 30.0}
        n1.idle_s, n1.gap_p99_s = {"a": 40.0, "b": 7.0}, {"a": 12.0, "b": 9.0}
        n2.sessions, n2.demand_fails = {"b": 50}, True  # left out, not fatal
        loop = _loop([n0, n1, n2])
        assert await loop.demand(["n0", "n1", "n2"]) == FleetDemand(
            {"a": 5.0, "b": 1.0},
            {"a": (10.0 + 3 * 2.0) / 4, "b": 5.0},
            {"a": 40.0, "b": 7.0},  # the least since a call: n1's a, n1's b
            {"a": 30.0, "b": 9.0},  # the largest gap quantile: n0's a, n1's b
        )

    run_virtual(main())
