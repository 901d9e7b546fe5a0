"""Fairness, live (issue 38): the noisy-neighbour preset's two tenants through real processes.

    .venv/bin/python bench/fairness_live.py                       # seed 0, time ×20, ~8 min
    .venv/bin/python bench/fairness_live.py --seed 3 --json out/fairness-live.json

Every part is a real process on loopback: one ``talaria runtime`` (the paper's node: its three
models on simulated engines, the clock ``--time-scale`` times real time) and one ``talaria
serve`` in front of it, on SQLite, with an API key per tenant (``talaria keys create --tenant
bulk``, ``--tenant ide --priority interactive``: the IDE tenant's class comes from its key's
default). The ``noisy`` preset's sessions for ``--seed`` (``bench/fairness.py`` replays the same
ones) are driven closed-loop, one agent per session, each with its tenant's key
(bench/harness/trace_drive.py), three times, each with fresh processes:

1. each tenant's sessions alone (``talaria``);
2. both tenants, the runtime on ``talaria`` (the fair queue on);
3. both tenants, the runtime on ``-fair_queue``.

Each reply runs to the trace's output tokens (vLLM's ``ignore_eos``, which the simulated engine
honours), as the replay's calls do.

Printed: per tenant, p50 / p95 / mean SCT (wall seconds × the time scale: simulated seconds)
beside the other ÷ alone, live and as the simulator predicts for the same sessions (ours: each
tenant against itself alone); and the peers' yardstick, as llm-d reports its flow control
(premium against standard at saturation): per tenant, its calls' p50 / p95 time to first token
and mean queue wait beside the other, simulated seconds (live: the proxy's stored calls,
``queue_s + prefill_s`` and ``queue_s``, which it stores in wall seconds, × the time scale).
Every process is stopped and every temporary folder removed on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack, closing
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/harness

from bench.harness.processes import talaria_runtime, talaria_serve, tenant_key
from bench.harness.trace_drive import Words, drive
from talaria.core.catalog import load_catalog
from talaria.core.trace import SessionTrace
from talaria.sim.experiment import run_experiment
from talaria.sim.metrics import percentile, sct_summary
from talaria.sim.presets import get_preset

TENANT_KEYS = {"bulk": ("--priority", "standard"), "ide": ("--priority", "interactive")}
"""Each tenant's key options: the IDE tenant's calls are interactive by its key's default."""


def log(message: str) -> None:
    print(f"[fairness-live {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def node_toml(policy: str, scale: float) -> str:
    preset = get_preset("noisy")
    blocks = "".join(f'\n[[model]]\nname = "{m}"\nengine = "sim"\n' for m in preset.workload.models)
    return (
        f'[node]\nname = "n0"\npolicy = "{policy}"\nquantum_s = {preset.quantum_s}\n'
        f'time_scale = {scale}\nserver = "{preset.server}"\nprofile = "{preset.profile}"\n{blocks}'
    )


def create_keys(data: Path) -> dict[str, str]:
    """One API key per tenant in the store of the proxy whose data dir is ``data``."""
    url = f"sqlite+aiosqlite:///{data / 'talaria.db'}"
    return {tenant: tenant_key(url, tenant, *options) for tenant, options in TENANT_KEYS.items()}


def run_live(
    sessions: list[SessionTrace], policy: str, scale: float, seed: int, work: Path
) -> dict[str, dict[str, float]]:
    """One drive of ``sessions`` through fresh processes: per tenant, its SCT summary."""
    with ExitStack() as stack:
        folder = Path(tempfile.mkdtemp(dir=work))
        data = folder / "data"
        data.mkdir()
        keys = create_keys(data)
        config = folder / "n0.toml"
        config.write_text(node_toml(policy, scale))
        runtime = stack.enter_context(talaria_runtime(config))
        args = ["--runtime", runtime.base_url, "--time-scale", str(scale)]
        env = {"TALARIA_DATABASE_URL": f"sqlite+aiosqlite:///{data / 'talaria.db'}"}
        proxy = stack.enter_context(talaria_serve(args, env, data))
        log(f"{policy}: {len(sessions)} sessions through {proxy.base_url} (time ×{scale:g})")

        def headers_of(session: SessionTrace) -> dict[str, str]:
            return {"authorization": f"Bearer {keys[session.tenant]}"}

        results = asyncio.run(
            drive(
                [proxy.base_url],
                sessions,
                Words(seed),
                seed,
                scale,
                ignore_eos=True,
                headers_of=headers_of,
            )
        )
    failures = [f for r in results for f in r.failures]
    if failures:
        log(f"{len(failures)} calls failed, first: {failures[0]}")
    tenant_of = {s.session_id: s.tenant for s in sessions}
    peers = stored_peers(data / "talaria.db", scale)
    out: dict[str, dict[str, float]] = {}
    for tenant in sorted(set(tenant_of.values())):
        scts = [r.sct_wall_s * scale for r in results if tenant_of[r.session_id] == tenant]
        out[tenant] = {**sct_summary(scts), **peers[tenant], "failed_calls": float(len(failures))}
    return out


def stored_peers(database: Path, scale: float) -> dict[str, dict[str, float]]:
    """Per tenant, the peers' yardstick from the proxy's stored calls (written before the
    proxy stopped): p50 / p95 of ``queue_s + prefill_s`` (time to first token) and the mean
    ``queue_s``, stored in wall seconds, × ``scale``: simulated seconds."""
    query = (
        "SELECT t.name, c.queue_s, c.prefill_s FROM calls c "
        "JOIN sessions s ON s.session_key = c.session_key JOIN tenants t ON t.id = s.tenant_id "
        "WHERE c.status = 'ok' AND c.queue_s IS NOT NULL AND c.prefill_s IS NOT NULL"
    )
    with closing(sqlite3.connect(database)) as db:
        rows = db.execute(query).fetchall()
    out: dict[str, dict[str, float]] = {}
    for tenant in sorted({r[0] for r in rows}):
        mine = [(q, p) for t, q, p in rows if t == tenant]
        ttft = [(q + p) * scale for q, p in mine]
        out[tenant] = {
            "p50_ttft_s": percentile(ttft, 50),
            "p95_ttft_s": percentile(ttft, 95),
            "mean_queue_s": statistics.fmean(q for q, _ in mine) * scale,
        }
    return out


def predicted(sessions: list[SessionTrace]) -> dict[str, dict[str, Any]]:
    """The simulator's per-tenant figures for ``sessions`` under both policies."""
    catalog = load_catalog([])
    preset = get_preset("noisy")
    setup = preset.experiment_setup(1, sessions, catalog)
    doc = run_experiment(
        sessions, catalog, setup, ("talaria", "-fair_queue"), include_dedicated=False
    )
    return {p: doc["policies"][p]["tenants"] for p in ("talaria", "-fair_queue")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-scale", type=float, default=20.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    catalog = load_catalog([])
    sessions = get_preset("noisy").sessions(catalog, args.seed)
    own = {t: [s for s in sessions if s.tenant == t] for t in ("bulk", "ide")}
    with tempfile.TemporaryDirectory(prefix="talaria-fairness-live-") as tmp:
        work = Path(tmp)
        live = {
            **{
                f"{t} alone": run_live(own[t], "talaria", args.time_scale, args.seed, work)
                for t in own
            },
            "talaria": run_live(sessions, "talaria", args.time_scale, args.seed, work),
            "-fair_queue": run_live(sessions, "-fair_queue", args.time_scale, args.seed, work),
        }
    sim = predicted(sessions)
    sim_alone = {
        t: predicted([s for s in sessions if s.tenant == t])["talaria"][t] for t in ("bulk", "ide")
    }
    alone_live = {t: live[f"{t} alone"][t] for t in ("bulk", "ide")}
    rows = []
    print("tenant  policy        live p50/p95/mean ÷ alone    simulated p50/p95/mean ÷ alone")
    for tenant in ("ide", "bulk"):
        for policy in ("talaria", "-fair_queue"):
            got = live[policy][tenant]
            want = sim[policy][tenant]
            ratios_live = [got[f"{k}_sct_s"] / alone_live[tenant][f"{k}_sct_s"] for k in KINDS]
            ratios_sim = [want[f"{k}_sct_s"] / sim_alone[tenant][f"{k}_sct_s"] for k in KINDS]
            rows.append({"tenant": tenant, "policy": policy, "live": ratios_live,
                         "simulated": ratios_sim, "live_sct": got})  # fmt: skip
            print(
                f"{tenant:6}  {policy:12}  "
                + " / ".join(f"{r:5.2f}" for r in ratios_live)
                + "          "
                + " / ".join(f"{r:5.2f}" for r in ratios_sim)
            )
    for t in ("ide", "bulk"):
        print(f"{t} alone: live p50 {alone_live[t]['p50_sct_s']:.1f} s, "
              f"simulated {sim_alone[t]['p50_sct_s']:.1f} s")  # fmt: skip
    print("peers' yardstick beside the other: TTFT p50 / p95 and mean queue, seconds")
    print("tenant  policy        live                      simulated")
    for tenant in ("ide", "bulk"):
        for policy in ("talaria", "-fair_queue"):
            got, want = live[policy][tenant], sim[policy][tenant]
            print(f"{tenant:6}  {policy:12}  {_peers(got):24}  {_peers(want)}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        document = {"seed": args.seed, "scale": args.time_scale, "live": live, "rows": rows}
        args.json.write_text(json.dumps(document, indent=2))


KINDS = ("p50", "p95", "mean")


def _peers(figures: dict[str, Any]) -> str:
    return " / ".join(f"{figures[k]:.2f}" for k in ("p50_ttft_s", "p95_ttft_s", "mean_queue_s"))


if __name__ == "__main__":
    main()
