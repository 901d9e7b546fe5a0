"""The proxy's time per new implicit session against the number of live sessions (the 660 s
finding's O(n) question).

    .venv/bin/python bench/session_scaling.py [--live 0,1000,5000,10000] [--probes 2000] \\
        [--gateway-probes 200] [--sweep-live 10000,100000] [--no-gateway] \\
        [--json out/session-scaling.json]

For each number of live sessions N, held by the probing tenant itself ("same tenant") or by
ten other tenants ("other tenants"), half named by their client and half implicit, each after
one call (and, in the same tenant, two implicit ones with a call in flight, so that a new
implicit call's side-call check has waiting sessions to consider):

- **book**: a new implicit session as the gateway opens it, on a ``SessionBook``
  (proxy/sessions/book.py): ``resolve`` (proxy/sessions/resolve.py: the conversation index
  misses; an implicit call with a system prompt and no tools goes through the side-call
  check, ``_side_call_of``, which used to scan the tenant's sessions) then ``call_started``.
  Median and p99 of ``--probes`` new sessions, each forgotten after it is timed so N stays N.
  The call's fingerprinting (``Conversation.of``) is timed apart: it does not depend on N.
- **gateway**: a new implicit call end to end through ``Gateway.open_call`` with the embedded
  simulated runtime (one node of glm-4.5-fp8, ``InProcessRuntime``, records to a null sink)
  on the virtual-time loop: ``open_call`` (admission with the node's status, resolve, route,
  start) and the process CPU time of the whole call (its run on the simulated engine and its
  records included). The N sessions are filled through the gateway too, so the node holds
  their sessions and KV as it would.
- **sweep**: the gateway's per-second work that is O(sessions): ``SessionBook.idle`` (the
  keeper's idle sweep, none idle) and ``SessionPreferences.sweep`` (every session tracked,
  none expired), at ``--sweep-live`` sessions. The sweep runs every clock second, so under
  ``--time-scale k`` it runs k times a wall second.

Everything is timed with ``time.perf_counter`` (``time.process_time`` for the call's CPU) in
this process; the figures are this machine's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from talaria.core.calls import Call
from talaria.core.catalog import load_catalog
from talaria.core.clock import LoopClock, run_virtual
from talaria.core.preferences import SessionPreferences
from talaria.core.protocol_status import status_from_dict, status_to_dict
from talaria.proxy.callpath.gateway import call_path
from talaria.proxy.contract.calls import PreparedCall
from talaria.proxy.contract.identity import Identity
from talaria.proxy.contract.metrics import ProxyMetrics
from talaria.proxy.contract.records import Record
from talaria.proxy.runtimes.embedded import InProcessRuntime
from talaria.proxy.sessions.book import SessionBook
from talaria.proxy.sessions.conversation import Conversation, fingerprint
from talaria.proxy.sessions.resolve import resolve
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import TALARIA
from talaria.runtime.sim_node import NodeSetup, build_sim_node

NOW = datetime(2026, 12, 4, tzinfo=UTC)
MODEL = "glm-4.5-fp8"
PROBE_TENANT = "t"
OTHER_TENANTS = 10
SYSTEM = "You are a coding agent. Use the tools to read, edit and test the repository. " * 20
PLACES = ("same tenant", "other tenants")


def _messages(tag: str) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Task {tag}: make tests/test_{tag}.py pass."},
    ]


def _owner(place: str, i: int) -> str:
    """The tenant of the ``i``-th live session."""
    return PROBE_TENANT if place == "same tenant" else f"o{i % OTHER_TENANTS}"


def _identity(i: int) -> Identity:
    """Even sessions are named by their client, odd ones implicit."""
    return Identity(f"agent-{i}", "x-session-id") if i % 2 == 0 else Identity(None, "implicit")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _summary_us(values_s: list[float]) -> dict[str, float]:
    us = [v * 1e6 for v in values_s]
    return {"median": round(statistics.median(us), 1), "p99": round(_pct(us, 0.99), 1)}


# -- the book ---------------------------------------------------------------------------------
def book_with(live: int, place: str, probes: int) -> SessionBook:
    """A book holding ``live`` sessions of ``place`` (module docstring), one call each; in the
    same tenant two implicit ones keep a call in flight."""
    book = SessionBook(capacity=live + probes + 10, max_per_tenant=live + probes + 10)
    reply = fingerprint({"role": "assistant", "content": "Running the tests."})
    for i in range(live):
        conversation = Conversation.of(_messages(f"live-{i}"))
        found = resolve(
            book,
            tenant_id=_owner(place, i),
            identity=_identity(i),
            model=MODEL,
            conversation=conversation,
            now_s=float(i),
            now_at=NOW,
        )
        book.call_started(found.state, conversation, float(i), found.thread)
        if place == "same tenant" and i in (1, 3):  # implicit, left waiting on a reply
            continue
        book.call_finished(found.state, conversation, reply, float(i), found.thread)
        book.call_ended(found.state, found.thread)
    return book


def time_book(live: int, place: str, probes: int) -> dict[str, Any]:
    """Median and p99 µs of a new implicit session's resolve + call_started (and of its
    fingerprinting) with ``live`` sessions of ``place``."""
    book = book_with(live, place, probes)
    open_s: list[float] = []
    print_s: list[float] = []
    for k in range(probes):
        messages = _messages(f"probe-{k}")
        t0 = time.perf_counter()
        conversation = Conversation.of(messages)
        t1 = time.perf_counter()
        found = resolve(
            book,
            tenant_id=PROBE_TENANT,
            identity=Identity(None, "implicit"),
            model=MODEL,
            conversation=conversation,
            now_s=float(live + k),
            now_at=NOW,
            offers_tools=False,
        )
        book.call_started(found.state, conversation, float(live + k), found.thread)
        t2 = time.perf_counter()
        assert found.how == "new", found.how
        print_s.append(t1 - t0)
        open_s.append(t2 - t1)
        book.call_ended(found.state, found.thread)
        book.forget(found.state)
    assert len(book) == live
    return {"open_us": _summary_us(open_s), "fingerprint_us": _summary_us(print_s)}


# -- the gateway --------------------------------------------------------------------------------
class NullSink:
    """Takes every record and commits it at once (the store is not what this measures)."""

    full = False
    failing_since = None

    def __init__(self) -> None:
        self.count = 0

    def submit(self, record: Record) -> int:
        """Count the record; its sequence number."""
        self.count += 1
        return self.count

    async def committed(self, seq: int) -> None:
        """Committed already."""


def _prepared(request_id: str, tenant: str, identity: Identity, tag: str) -> PreparedCall:
    messages = tuple(_messages(tag))
    return PreparedCall(
        request_id=request_id,
        tenant_id=tenant,
        identity=identity,
        api="chat",
        content=Call(model=MODEL, messages=messages),
        max_tokens=16,
    )


def time_gateway(live: int, place: str, probes: int) -> dict[str, Any]:
    """A new implicit call through the gateway and the embedded simulated node, ``live``
    sessions of ``place`` filled through the same gateway first (virtual time)."""

    async def main() -> dict[str, Any]:
        clock = LoopClock()
        setup = NodeSetup("h200x8", "default", (MODEL,))
        node = build_sim_node("n0", setup, load_catalog(), TALARIA, SchedulerConfig(), clock)
        runtime = InProcessRuntime(node, clock)
        await runtime.start()
        path = call_path(
            [runtime],
            NullSink(),
            ProxyMetrics(),
            clock,
            max_sessions_per_tenant=live + probes + 10,
            session_idle_timeout_s=10**9,
        )
        gateway = path.gateway
        gateway.start()
        try:
            for i in range(live):
                call = _prepared(f"fill-{i}", _owner(place, i), _identity(i), f"live-{i}")
                await (await gateway.open_call(call)).outcome()
            open_s: list[float] = []
            cpu_s: list[float] = []
            for k in range(probes):
                call = _prepared(f"probe-{k}", PROBE_TENANT, Identity(None, "implicit"), f"p{k}")
                c0, t0 = time.process_time(), time.perf_counter()
                handle = await gateway.open_call(call)
                t1 = time.perf_counter()
                await handle.outcome()
                cpu_s.append(time.process_time() - c0)
                open_s.append(t1 - t0)
                assert handle.how == "new", handle.how
            document = status_to_dict(node.status())
            return {
                "open_call_us": _summary_us(open_s),
                "call_cpu_us": _summary_us(cpu_s),
                "node_kv_entries": len(node.memory.kv),
                "live_sessions": len(path.keeper.sessions),
                "node_status_ms": round(_median_s(node.status, 11) * 1e3, 2),
                "status_decode_ms": round(
                    _median_s(lambda: status_from_dict(document), 11) * 1e3, 2
                ),
            }
        finally:
            await gateway.close()
            await runtime.close()

    return run_virtual(main())


# -- the sweep ------------------------------------------------------------------------------------
def _median_s(work: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        work()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_sweep(live: int) -> dict[str, float]:
    """ms of one ``SessionBook.idle`` and one ``SessionPreferences.sweep`` over ``live``
    sessions (none idle, none expired)."""
    book = book_with(live, "other tenants", 0)
    reservations = SessionPreferences()
    for state in book:
        reservations.finished(state.key, "n0", 0.0, final=False, asks_tools=True, hint_s=1e9)
    idle_s = _median_s(lambda: book.idle(float(live), float(live) + 600.0), 21)  # none idle
    sweep_s = _median_s(lambda: reservations.sweep(float(live)), 21)
    return {"idle_ms": round(idle_s * 1e3, 3), "reservations_sweep_ms": round(sweep_s * 1e3, 3)}


def _levels(text: str) -> Iterator[int]:
    return (int(x) for x in text.split(","))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--live", default="0,1000,5000,10000")
    parser.add_argument("--probes", type=int, default=2000, help="new sessions on the book")
    parser.add_argument("--gateway-probes", type=int, default=200)
    parser.add_argument("--no-gateway", action="store_true")
    parser.add_argument("--sweep-live", default="10000,100000")
    parser.add_argument("--json", type=Path, default=Path("out/session-scaling.json"))
    args = parser.parse_args()
    doc: dict[str, Any] = {"command": " ".join(sys.argv), "new_session": [], "sweep": []}
    print(
        "| live sessions | whose | book: resolve + open, median / p99 µs | fingerprint µs "
        "| gateway: open_call, median / p99 µs | gateway: whole call CPU, median / p99 µs "
        "| node status ms | status decode ms |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for live in _levels(args.live):
        for place in PLACES:
            row: dict[str, Any] = {"live": live, "whose": place}
            row["book"] = time_book(live, place, args.probes)
            if not args.no_gateway:
                row["gateway"] = time_gateway(live, place, args.gateway_probes)
            doc["new_session"].append(row)
            book = row["book"]
            gateway = row.get("gateway")
            cells = [
                f"{live:,}",
                place,
                f"{book['open_us']['median']} / {book['open_us']['p99']}",
                f"{book['fingerprint_us']['median']}",
            ]
            if gateway is None:
                cells += ["—"] * 4
            else:
                open_us, cpu_us = gateway["open_call_us"], gateway["call_cpu_us"]
                cells += [
                    f"{open_us['median']} / {open_us['p99']}",
                    f"{cpu_us['median']} / {cpu_us['p99']}",
                    f"{gateway['node_status_ms']}",
                    f"{gateway['status_decode_ms']}",
                ]
            print("| " + " | ".join(cells) + " |", flush=True)
    print()
    print("| live sessions | SessionBook.idle ms | SessionPreferences.sweep ms |")
    print("|---|---|---|")
    for live in _levels(args.sweep_live):
        sweep = {"live": live, **time_sweep(live)}
        doc["sweep"].append(sweep)
        print(f"| {live:,} | {sweep['idle_ms']} | {sweep['reservations_sweep_ms']} |", flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
