"""``talaria replay``: agent sessions on simulated nodes in virtual time, policies compared."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from talaria.cli.common import CatalogOpt, catalog_of, console, fail, generate, progress_bar, stdout
from talaria.core.catalog import Catalog
from talaria.core.catalog_error import CatalogError
from talaria.core.trace import TraceError, read_trace
from talaria.core.types import CallResult


def _profile_name(path: Path) -> str:
    """The ``name`` of the ``[profile]`` table in a catalog TOML file."""
    import tomllib

    try:
        name = tomllib.loads(path.read_text())["profile"]["name"]
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError) as exc:
        raise typer.BadParameter(f"{path}: no [profile] with a name ({exc})") from exc
    return str(name)


def _check_fits(catalog: Catalog, server: str, models: Sequence[str]) -> None:
    """Refuse a model whose weights alone exceed a node's usable HBM: its replay cannot start
    (the node's memory accounting raises ``CapacityError`` at the first switch to it)."""
    usable = catalog.server(server).usable_hbm_bytes
    for name in models:
        weights = catalog.model(name).weight_bytes
        if weights > usable:
            raise fail(
                f"model {name!r} does not fit server {server!r}: its weights take "
                f"{weights / 1e9:,.3g} GB, a node's usable HBM is {usable / 1e9:,.3g} GB"
            )


def _check_sweep(param: str, values: list[float]) -> None:
    """The sweep values that no replay accepts: a quantum or a session count that is not > 0."""
    if param == "quantum_s":
        bad = [v for v in values if not (math.isfinite(v) and v > 0)]
        rule = "> 0"
    elif param == "sessions":
        bad = [v for v in values if not (v.is_integer() and v >= 1)]
        rule = "whole numbers >= 1"
    else:
        return
    if bad:
        raise typer.BadParameter(
            f"{param} values must be {rule}, got {', '.join(f'{v:g}' for v in bad)}",
            param_hint="'--sweep'",
        )


def replay(
    preset: Annotated[
        str,
        typer.Option(
            help="Workload and node setup: 'paper' (30 sessions, 960 calls, one "
            "8×H200 node, three 100B+ models), 'small', 'cluster' (four nodes, six "
            "models, 120 sessions; a router picks the node of every call), 'subagents' "
            "('cluster' where a third of the sessions spawn a sub-agent sharing their "
            "prompt's start), 'fleet' (fifteen models, 600 sessions whose model shares shift "
            "and burst, packed onto 8 nodes or --nodes by demand), 'noisy' or 'saturated' "
            "(tenants at saturation)."
        ),
    ] = "paper",
    trace: Annotated[
        Path | None,
        typer.Option(
            help="Replay this JSONL trace instead of generating sessions "
            "(docs/trace-format.md); its models must be in the catalog."
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the workload generator.")] = 0,
    policies: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated policies (default: the preset's): round (load-only router, "
            "all flags off), talaria (talaria router, all flags on), placement (talaria "
            "with the placement controller moving models between nodes by demand), serverless "
            "(request-level instances with a fixed keep-alive, no session awareness), "
            "load-only, sticky, kv-aware (that router, all flags on), +sp_admission, "
            "+host_kv, +d2d_staging, +soft_reservations (one flag over round)."
        ),
    ] = None,
    quantum_s: Annotated[
        float | None,
        typer.Option(help="Slot quantum in seconds, > 0 (default: the preset's)."),
    ] = None,
    sessions: Annotated[
        int | None,
        typer.Option(min=1, help="Override the preset's session count (calls scale)."),
    ] = None,
    nodes: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Nodes that each host every model (default 1; presets with their own "
            "node layout, like 'cluster', ignore it; 'fleet' packs its models onto them).",
        ),
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the results document here.")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="Write a PNG: SCT CDF per policy and slot timelines.")
    ] = None,
    sweep: Annotated[
        list[str] | None,
        typer.Option(
            help="Sensitivity sweep NAME=V1,V2,... (repeatable); NAME in: quantum_s, "
            "sessions, mean_interarrival_s, zipf_s, weight_bw_scale, "
            "compute_efficiency, memory_efficiency, step_overhead_s."
        ),
    ] = None,
    sweep_seeds: Annotated[
        int,
        typer.Option(
            min=1,
            help="Workload seeds per sweep point (seed, seed+1, ...); rows report "
            "the median over them.",
        ),
    ] = 3,
    server: Annotated[
        str | None,
        typer.Option(help="Server of the nodes, a catalog name (default: the preset's)."),
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(
            help="Efficiency profile: a catalog name, or a TOML file such as `talaria "
            "calibrate` writes (its \\[profile] is used; default: the preset's)."
        ),
    ] = None,
    catalog_dirs: CatalogOpt = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Replay agent sessions on a simulated node in virtual time and compare policies.

    Prints p50/p95/mean session completion time (SCT) per policy, the speedup over 'round',
    the ratio to the oracle bound (each session alone, model resident) and the 'dedicated'
    reference (one node per model, never switched).
    """
    from talaria.runtime.memory.resources import CapacityError
    from talaria.runtime.scheduling.intake import CallTooLargeError
    from talaria.sim.experiment import run_experiment
    from talaria.sim.policies import resolve_policy
    from talaria.sim.presets import get_preset
    from talaria.sim.report import experiment_table, routing_table, sweep_table
    from talaria.sim.sweep import parse_sweep, run_sweep

    if quantum_s is not None and not (math.isfinite(quantum_s) and quantum_s > 0):
        raise typer.BadParameter(f"must be > 0, got {quantum_s:g}", param_hint="'--quantum-s'")
    profile_file = Path(profile) if profile and profile.endswith(".toml") else None
    catalog = catalog_of([*(catalog_dirs or []), *([profile_file] if profile_file else [])])
    try:
        chosen = get_preset(preset)
        if server is not None:
            chosen = replace(chosen, server=catalog.server(server).name)
        if profile is not None:
            profile_name = _profile_name(profile_file) if profile_file else profile
            chosen = replace(chosen, profile=catalog.profile(profile_name).name)
        chosen_policies = policies if policies is not None else ",".join(chosen.policies)
        names = [p.strip() for p in chosen_policies.split(",") if p.strip()]
        for name in names:
            resolve_policy(name)
        sweeps = [parse_sweep(s) for s in sweep or []]
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    for param, values in sweeps:
        _check_sweep(param, values)
    if quantum_s is not None:
        chosen = replace(chosen, quantum_s=quantum_s)
    if sessions is not None:
        chosen = chosen.with_sessions(sessions)
    try:
        if trace is not None:
            traced = read_trace(trace)
            models = tuple(dict.fromkeys(s.model for s in traced))
            for m in models:
                catalog.model(m)
            chosen = replace(chosen, workload=replace(chosen.workload, models=models))
            session_list = traced
        else:
            session_list = chosen.sessions(catalog, seed)
    except (TraceError, CatalogError, OSError) as exc:
        raise typer.BadParameter(str(exc)) from exc

    calls = sum(s.num_calls for s in session_list)
    runs = len(names) + 1
    try:
        setup = chosen.experiment_setup(nodes, session_list, catalog)
        _check_fits(catalog, setup.server, setup.models)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    try:
        with progress_bar("calls") as bar:
            task = bar.add_task("replay", total=calls * runs, visible=progress)

            def tick(_: CallResult) -> None:
                bar.advance(task)

            doc: dict[str, Any] = run_experiment(session_list, catalog, setup, names, tick)
            doc.update(
                preset=chosen.name,
                seed=seed if trace is None else None,
                trace=str(trace) if trace else None,
            )
            if sweeps:
                points = sum(len(v) for _, v in sweeps) * sweep_seeds
                sweep_task = bar.add_task("sweep", total=None, visible=progress)
                bar.update(sweep_task, description=f"sweep ({points} replays of 3 layouts)")

                def sweep_tick(_: CallResult) -> None:
                    bar.advance(sweep_task)

                seeds = range(seed, seed + sweep_seeds)
                rows = run_sweep(chosen, catalog, sweeps, generate, seeds, sweep_tick)
                doc["sweep"] = rows
    except (CapacityError, CallTooLargeError) as exc:
        # A call's KV cache (a huge prompt in a trace) needs more memory than a node has.
        raise fail(f"the workload does not fit server {setup.server!r}: {exc}") from None
    out = stdout()
    out.print(experiment_table(doc))
    routing = routing_table(doc)
    if routing is not None:
        out.print(routing)
    if "multiplexing_cost_p50" in doc:
        out.print(
            f"talaria ÷ dedicated: p50 {doc['multiplexing_cost_p50']:.2f}×, "
            f"p95 {doc['multiplexing_cost_p95']:.2f}×"
        )
    if rows:
        out.print(sweep_table(rows))
    console.print(f"replayed in {time.perf_counter() - started:.1f} s wall")
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        console.print(f"wrote {json_out}")
    if plot is not None:
        from talaria.sim.plots import plot_experiment, plot_sweep

        source = f"trace {trace.name}" if trace else f"preset {chosen.name}, seed {seed}"
        title = (
            f"{source}: {doc['sessions']} sessions, {doc['calls']} calls, "
            f"{setup.nodes} node(s), quantum {chosen.quantum_s:g} s"
        )
        plot_experiment(doc, plot, title=title)
        console.print(f"wrote {plot}")
        if rows:
            sweep_png = plot.with_name(plot.stem + "-sweep" + plot.suffix)
            plot_sweep(rows, sweep_png)
            console.print(f"wrote {sweep_png}")
