"""Placement live against the simulator: the same contended workload through real processes,
the layout fixed (static) and moved by the proxy's placement controller.

    .venv/bin/python bench/placement_live.py                    # ~2.5 min on 2 cores
    .venv/bin/python bench/placement_live.py --pairs 32 --spacing-s 15 --json out/pl.json

The workload is tests/sim/test_placement_replay.py's: two busy models time-sharing node n0
(``--pairs`` sessions of each, one every ``--spacing-s`` seconds, interleaved), a light model
alone on n1 (one session every 100 s), an idle model alone on n2; each session has 20 calls,
its prompt growing from 8,000 to 27,000 tokens, 300 output tokens a call, 5 s tool gaps.

Live, every part is a real process on loopback: one ``talaria runtime`` per node (simulated
engines, the ``talaria`` scheduler, the clock ``--time-scale`` times real time) and one
``talaria serve --runtime ...`` at the same time scale over SQLite. *static*: no library, the
layout stays. *placement*: ``--placement-library`` lists the four models, so the controller
(proxy/placement/loop.py, its defaults: a look every 60 s, min hold 900 s, ...) may move
them; a model placed on a running runtime serves after ``ServerSpec.placement_s`` from
storage on the node's clock (runtime/engine_kinds.py ``EngineKind.loads_on_clock``). The sessions
are driven closed-loop by bench/harness/trace_drive.py ``drive``, as bench/cluster_live.py
drives them (one agent per session, its start and tool gaps divided by the time scale), each
reply held to the trace's 300 output tokens (``ignore_eos``: the simulated engine's own
answers are shorter).

The simulator replays the same sessions on the same layout (``sim.replay``, policy
``talaria``), with and without ``PlacementConfig()``. One difference is known: the replay's
controller copies a moved model's weights from a peer's host memory (the fabric), the live
runtime loads them from storage (no peer copy is built), so a live move is slower to serve.

Printed per run: p50 and p95 session completion time (SCT, simulated seconds) of all busy
sessions and of the later half (those arriving after the first half's last: where a move has
had time to pay off), the moves made, failed calls.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/harness

import httpx

from bench.harness.processes import talaria_runtime, talaria_serve
from bench.harness.trace_drive import SessionResult, Words, drive
from talaria.core.catalog import load_catalog
from talaria.core.placement import PlacementConfig
from talaria.core.trace import SessionTrace, TraceCall
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import TALARIA
from talaria.runtime.sim_node import NodeSetup
from talaria.sim.metrics import percentile
from talaria.sim.replay import replay

ADMIN = "placement-bench-admin"
BUSY = ("glm-4.5-fp8", "qwen3-235b-a22b-bf16")
LAYOUT = (BUSY, ("gpt-oss-120b",), ("llama-4-scout-bf16",))
CALLS, GAP_S, OUTPUT = 20, 5.0, 300


def log(message: str) -> None:
    print(f"[placement-live {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def session(sid: str, model: str, start: float) -> SessionTrace:
    """20 calls, the prompt growing 8,000 → 27,000 tokens (tests/sim/test_placement_replay.py)."""
    calls = tuple(
        TraceCall(
            sid, i, model, start, 8_000 + 1_000 * i, 8_000 if i == 0 else 1_000, OUTPUT,
            GAP_S if i < CALLS - 1 else None,
        )
        for i in range(CALLS)
    )  # fmt: skip
    return SessionTrace(sid, model, start, calls)


def workload(pairs: int, spacing_s: float) -> list[SessionTrace]:
    sessions = []
    for i in range(pairs):
        sessions.append(session(f"a{i}", BUSY[0], spacing_s * i))
        sessions.append(session(f"b{i}", BUSY[1], spacing_s * i + spacing_s / 2))
    light = int(pairs * spacing_s // 100) + 1
    sessions += [session(f"c{i}", "gpt-oss-120b", 100.0 * i) for i in range(light)]
    return sorted(sessions, key=lambda s: s.start_s)


def node_toml(name: str, models: tuple[str, ...], scale: float) -> str:
    blocks = "".join(f'\n[[model]]\nname = "{m}"\nengine = "sim"\n' for m in models)
    return f'[node]\nname = "{name}"\npolicy = "talaria"\ntime_scale = {scale}\n{blocks}'


def figures(sct: dict[str, float], sessions: list[SessionTrace], pairs: int) -> dict[str, Any]:
    """p50/p95 SCT of the busy sessions, all and the later half (arrived after a/b[pairs/2])."""
    half = {s.session_id for s in sessions if s.session_id[0] in "ab"}
    late = {sid for sid in half if int(sid[1:]) >= pairs // 2}
    out: dict[str, Any] = {}
    for name, ids in (("busy", half), ("busy_late", late)):
        values = [sct[s] for s in ids if s in sct]
        out[f"{name}_p50_s"] = percentile(values, 50)
        out[f"{name}_p95_s"] = percentile(values, 95)
    return out


def live_run(
    sessions: list[SessionTrace], pairs: int, scale: float, placement: bool, work: Path
) -> dict[str, Any]:
    with ExitStack() as stack:
        runtimes = []
        for i, models in enumerate(LAYOUT):
            config = work / f"n{i}.toml"
            config.write_text(node_toml(f"n{i}", models, scale))
            runtimes.append(stack.enter_context(talaria_runtime(config)))
        args = ["--time-scale", str(scale), "--durability", "async"]
        for runtime in runtimes:
            args += ["--runtime", runtime.base_url]
        if placement:
            library = work / "library.toml"
            library.write_text(
                "".join(f'[[model]]\nname = "{m}"\nengine = "sim"\n\n' for ms in LAYOUT for m in ms)
            )
            args += ["--placement-library", str(library)]
        data = work / ("placement" if placement else "static")
        data.mkdir()
        env = {"TALARIA_ADMIN_TOKEN": ADMIN}
        proxy = stack.enter_context(talaria_serve(args, env, data))
        log(f"{'placement' if placement else 'static'}: driving {len(sessions)} sessions")
        results: list[SessionResult] = asyncio.run(
            drive([proxy.base_url], sessions, Words(0), 0, scale, ignore_eos=True, log=log)
        )
        moves: list[dict[str, Any]] = []
        if placement:
            answer = httpx.get(
                proxy.base_url + "/admin/placement", headers={"authorization": f"Bearer {ADMIN}"}
            )
            moves = answer.json()["moves"]
        sct = {r.session_id: r.sct_wall_s * scale for r in results}
        failures = [f for r in results for f in r.failures]
        return {
            **figures(sct, sessions, pairs),
            "moves": moves,
            "calls": sum(r.calls for r in results),
            "failures": len(failures),
            "first_failures": failures[:5],
        }


def simulated(sessions: list[SessionTrace], pairs: int, placement: bool) -> dict[str, Any]:
    layout = [(f"n{i}", NodeSetup("h200x8", "default", ms)) for i, ms in enumerate(LAYOUT)]
    outcome = replay(
        sessions,
        load_catalog(),
        layout,
        TALARIA,
        SchedulerConfig(),
        placement=PlacementConfig() if placement else None,
    )
    sct = {s.session_id: s.sct_s for s in outcome.sessions}
    moves = outcome.placement["moves"] if outcome.placement else []
    return {**figures(sct, sessions, pairs), "moves": moves}


def move_text(moves: list[dict[str, Any]]) -> str:
    shown = [
        f"{m['kind']} {m['model']} → {m.get('runtime') or m.get('node')} ({m['reason']})"
        for m in moves
    ]
    return "; ".join(shown) or "none"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--pairs", type=int, default=24, help="Sessions of each busy model.")
    parser.add_argument("--spacing-s", type=float, default=20.0, help="Seconds between pairs.")
    parser.add_argument("--time-scale", type=float, default=20.0, help="Live clock × real time.")
    parser.add_argument("--json", type=Path, help="Write the figures here.")
    args = parser.parse_args()
    sessions = workload(args.pairs, args.spacing_s)
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="talaria-placement-live-") as tmp:
        for placement in (False, True):
            mode = "placement" if placement else "static"
            runs[f"sim {mode}"] = simulated(sessions, args.pairs, placement)
            folder = Path(tmp) / mode
            folder.mkdir()
            runs[f"live {mode}"] = live_run(
                sessions, args.pairs, args.time_scale, placement, folder
            )
    print(
        "| run | busy p50 s | busy p95 s | later half p50 s | later half p95 s | failed calls "
        "| moves |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, run in runs.items():
        print(
            f"| {name} | {run['busy_p50_s']:,.1f} | {run['busy_p95_s']:,.1f} "
            f"| {run['busy_late_p50_s']:,.1f} | {run['busy_late_p95_s']:,.1f} "
            f"| {run.get('failures', '–')} | {move_text(run['moves'])} |"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        document = {"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs}
        args.json.write_text(json.dumps(document, indent=2))


if __name__ == "__main__":
    main()
