"""Chaos under the real topology: nginx (deploy/nginx/talaria.conf) in front of three
``talaria serve`` replicas (``TALARIA_REPLICA_AFFINITY=ingress``) on PostgreSQL, over two
simulated ``talaria runtime`` nodes, under a continuous streaming load on the three APIs,
while one replica is killed (kill -9) and restarted, one runtime is stopped (SIGSTOP) for
20 s, and PostgreSQL is restarted.

    .venv/bin/python bench/chaos.py                      # 48 named + 12 implicit sessions
    .venv/bin/python bench/chaos.py --sessions 18 --implicit 6 --runs 3

Prints, per run, the failed calls by fault and API, how long the load took to recover from
each fault, and the store's checks: acknowledged calls lost, named sessions split, repeated
call indices (bench/harness/chaos/ says how each is measured). tests/e2e/test_chaos.py runs
the same scenario with fewer sessions and asserts those figures. Needs nginx (TALARIA_NGINX,
or bash scripts/apt-provide.sh nginx-light nginx) and PostgreSQL's binaries (scripts/pg.sh).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/harness

from bench.harness.chaos import ChaosConfig, run_chaos
from bench.harness.nginx import nginx_binary


def main() -> None:
    """Parse the options, run the scenario ``--runs`` times, print each run's tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=48, help="named sessions")
    parser.add_argument("--implicit", type=int, default=12, help="sessions without a header")
    parser.add_argument("--time-scale", type=float, default=50.0)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--stop-s", type=float, default=20.0, help="how long SIGSTOP lasts")
    parser.add_argument("--pg-down-s", type=float, default=0.0)
    parser.add_argument("--no-restart", action="store_true", help="leave the killed replica")
    parser.add_argument("--bound-s", type=float, default=60.0, help="longest recovery wait")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep each run's folder (logs)")
    parser.add_argument("--failures", action="store_true", help="list every failed call")
    args = parser.parse_args()
    binary = nginx_binary()
    if binary is None:
        sys.exit("no nginx: bash scripts/apt-provide.sh nginx-light nginx")
    failed = False
    for run in range(args.runs):
        config = ChaosConfig(
            sessions=args.sessions,
            implicit=args.implicit,
            time_scale=args.time_scale,
            max_tokens=args.max_tokens,
            stop_s=args.stop_s,
            pg_down_s=args.pg_down_s,
            restart_replica=not args.no_restart,
            recovery_bound_s=args.bound_s,
            seed=args.seed + run,
        )
        folder = Path(tempfile.mkdtemp(prefix="talaria-chaos-"))
        started = time.monotonic()
        try:
            report = run_chaos(config, folder, binary, log=lambda s: print(f"  {s}", flush=True))
        finally:
            if not args.keep:
                shutil.rmtree(folder, ignore_errors=True)
        print(f"\nrun {run} (seed {config.seed}, {time.monotonic() - started:.0f} s in all):")
        print(report.table(), flush=True)
        if args.failures:
            print("failed calls:", *report.failure_lines(), sep="\n")
        if args.keep:
            print(f"logs: {report.logs}")
        recovered = all(f.every_session_s is not None for f in report.faults)
        failed |= bool(report.lost or report.split or report.repeated or not recovered)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
