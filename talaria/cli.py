"""The ``talaria`` command."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from talaria.core.catalog import Catalog, CatalogError, load_catalog
from talaria.core.types import CallResult
from talaria.runtime.scheduling.flags import policy_flags
from talaria.sim.trace import SessionTrace, TraceError, read_trace, write_trace
from talaria.sim.workload import WorkloadSpec, generate_sessions

app = typer.Typer(
    help="Talaria: session-aware serving of tool-using agents on shared GPU nodes.",
    no_args_is_help=True,
    add_completion=False,
)
trace_app = typer.Typer(help="Make and inspect replay traces (JSONL, one call per line).")
app.add_typer(trace_app, name="trace")
console = Console(stderr=True)

CatalogOpt = Annotated[
    list[Path] | None,
    typer.Option("--catalog", help="Extra directory or TOML file of models/servers/profiles."),
]


def _catalog(extra: list[Path] | None) -> Catalog:
    try:
        return load_catalog(extra or [])
    except CatalogError as exc:
        raise typer.BadParameter(str(exc)) from exc


def _generate(spec: WorkloadSpec, catalog: Catalog, seed: int) -> list[SessionTrace]:
    models = [catalog.model(m) for m in spec.models]
    return generate_sessions(
        spec,
        {m.name: m.context_window_tokens for m in models},
        {m.name: m.reasoning for m in models},
        seed,
    )


def _stdout() -> Console:
    """Tables go to stdout, full width even when piped to a file."""
    out = Console()
    return out if out.is_terminal else Console(width=200)


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("calls"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


@app.command()
def replay(
    preset: Annotated[
        str,
        typer.Option(
            help="Workload and node setup: 'paper' (30 sessions, 960 calls, one "
            "8×H200 node, three 100B+ models), 'small', or 'cluster' (four nodes, six "
            "models, 120 sessions; a router picks the node of every call)."
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
            "all flags off), talaria (talaria router, all flags on), load-only, sticky, "
            "kv-aware (that router, all flags on), +sp_admission, +host_kv, +d2d_staging, "
            "+soft_reservations (one flag over round)."
        ),
    ] = None,
    quantum_s: Annotated[
        float | None, typer.Option(help="Slot quantum in seconds (default: the preset's).")
    ] = None,
    sessions: Annotated[
        int | None, typer.Option(help="Override the preset's session count (calls scale).")
    ] = None,
    nodes: Annotated[
        int | None,
        typer.Option(
            help="Nodes that each host every model (default 1; presets with their own "
            "node layout, like 'cluster', ignore it)."
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
            help="Workload seeds per sweep point (seed, seed+1, ...); rows report "
            "the median over them."
        ),
    ] = 3,
    catalog_dirs: CatalogOpt = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Replay agent sessions on a simulated node in virtual time and compare policies.

    Prints p50/p95/mean session completion time (SCT) per policy, the speedup over 'round',
    the ratio to the oracle bound (each session alone, model resident) and the 'dedicated'
    reference (one node per model, never switched).
    """
    from talaria.sim.experiment import run_experiment
    from talaria.sim.policies import resolve_policy
    from talaria.sim.presets import get_preset
    from talaria.sim.report import experiment_table, routing_table, sweep_table
    from talaria.sim.sweep import parse_sweep, run_sweep

    catalog = _catalog(catalog_dirs)
    try:
        chosen = get_preset(preset)
        chosen_policies = policies if policies is not None else ",".join(chosen.policies)
        names = [p.strip() for p in chosen_policies.split(",") if p.strip()]
        for name in names:
            resolve_policy(name)
        sweeps = [parse_sweep(s) for s in sweep or []]
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    if quantum_s is not None:
        chosen = replace(chosen, quantum_s=quantum_s)
    if sessions is not None:
        w = chosen.workload
        total = round(w.total_calls / w.sessions * sessions) if w.total_calls else None
        chosen = replace(chosen, workload=replace(w, sessions=sessions, total_calls=total))
    try:
        if trace is not None:
            traced = read_trace(trace)
            models = tuple(dict.fromkeys(s.model for s in traced))
            for m in models:
                catalog.model(m)
            chosen = replace(chosen, workload=replace(chosen.workload, models=models))
            session_list = traced
        else:
            session_list = _generate(chosen.workload, catalog, seed)
    except (TraceError, CatalogError, OSError) as exc:
        raise typer.BadParameter(str(exc)) from exc

    calls = sum(s.num_calls for s in session_list)
    runs = len(names) + 1
    try:
        setup = chosen.experiment_setup(nodes)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    started = time.perf_counter()
    with _progress() as bar:
        task = bar.add_task("replay", total=calls * runs, visible=progress)

        def tick(_: CallResult) -> None:
            bar.advance(task)

        doc: dict[str, Any] = run_experiment(session_list, catalog, setup, names, tick)
        doc.update(
            preset=chosen.name,
            seed=seed if trace is None else None,
            trace=str(trace) if trace else None,
        )
        rows: list[dict[str, Any]] = []
        if sweeps:
            points = sum(len(v) for _, v in sweeps) * sweep_seeds
            sweep_task = bar.add_task("sweep", total=None, visible=progress)
            bar.update(sweep_task, description=f"sweep ({points} replays of 3 layouts)")

            def sweep_tick(_: CallResult) -> None:
                bar.advance(sweep_task)

            seeds = range(seed, seed + sweep_seeds)
            rows = run_sweep(chosen, catalog, sweeps, _generate, seeds, sweep_tick)
            doc["sweep"] = rows
    out = _stdout()
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


@trace_app.command("generate")
def trace_generate(
    out: Annotated[Path, typer.Option(help="Where to write the JSONL trace.")],
    preset: Annotated[str, typer.Option(help="Workload preset.")] = "paper",
    seed: Annotated[int, typer.Option(help="Generator seed.")] = 0,
    sessions: Annotated[int | None, typer.Option(help="Override the session count.")] = None,
    catalog_dirs: CatalogOpt = None,
) -> None:
    """Generate SWE-bench-like sessions (FACTS.md §2 distributions) as a replayable trace."""
    from talaria.sim.presets import get_preset

    catalog = _catalog(catalog_dirs)
    try:
        chosen = get_preset(preset)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    workload = chosen.workload
    if sessions is not None:
        total = (
            round(workload.total_calls / workload.sessions * sessions)
            if workload.total_calls
            else None
        )
        workload = replace(workload, sessions=sessions, total_calls=total)
    traced = _generate(workload, catalog, seed)
    write_trace(out, traced)
    console.print(
        f"wrote {len(traced)} sessions, {sum(s.num_calls for s in traced)} calls to {out}"
    )


@app.command()
def catalog(catalog_dirs: CatalogOpt = None) -> None:
    """List the models, servers and efficiency profiles the catalog knows."""
    cat = _catalog(catalog_dirs)
    out = _stdout()
    for m in cat.models.values():
        out.print(
            f"model  {m.name:28} {m.total_params / 1e9:6.0f}B total {m.active_params / 1e9:5.0f}B"
            f" active  {m.weight_bytes / 1e9:6.0f} GB  KV {m.kv_bytes_per_token_tp8:,} B/token "
            f"(TP8)  ctx {m.context_window_tokens:,}"
        )
    for s in cat.servers.values():
        out.print(f"server {s.name:28} {s.gpus}×{s.hbm_bytes_per_gpu / 1e9:.0f} GB HBM")
    for p in cat.profiles.values():
        out.print(f"profile {p.name}")


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    time_scale: Annotated[
        float | None,
        typer.Option(
            help="Simulated seconds per real second for the embedded simulated "
            "engines (default 1: real time; e.g. 20 runs 20× faster)."
        ),
    ] = None,
    models: Annotated[
        str | None, typer.Option(help="Comma-separated models of the embedded node(s).")
    ] = None,
    nodes: Annotated[int | None, typer.Option(help="Embedded simulated nodes.")] = None,
    policy: Annotated[
        str | None, typer.Option(help="Scheduler flags of the embedded nodes (as in replay).")
    ] = None,
    router: Annotated[
        str | None, typer.Option(help="talaria, load-only, sticky or kv-aware.")
    ] = None,
    database_url: Annotated[
        str | None,
        typer.Option(help="SQLAlchemy URL (default: SQLite in the user data directory)."),
    ] = None,
    runtime: Annotated[
        list[str] | None,
        typer.Option(
            "--runtime",
            help="URL of a runtime server (talaria runtime), repeatable; without any, the "
            "proxy runs an embedded simulated runtime.",
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
) -> None:
    """Serve the OpenAI-compatible proxy (embedded simulated runtime, or --runtime URLs).

    Any OpenAI client works against it: base_url http://HOST:PORT/v1. Sessions are identified
    by the X-Talaria-Session-Id header (or x-session-id, x-litellm-session-id, body
    litellm_session_id / prompt_cache_key). Settings also come from TALARIA_* environment
    variables (TALARIA_API_KEYS, TALARIA_ADMIN_TOKEN, TALARIA_DATABASE_URL, ...). The simulated
    engines time every call with the cost model; their text is synthetic.
    """
    import uvicorn

    from talaria.proxy.app import create_app
    from talaria.proxy.settings import ProxySettings

    overrides: dict[str, Any] = {
        key: value
        for key, value in {
            "time_scale": time_scale,
            "models": models,
            "nodes": nodes,
            "policy": policy,
            "router": router,
            "database_url": database_url,
            "runtimes": runtime or None,
        }.items()
        if value is not None
    }
    try:
        settings = ProxySettings(**overrides)
        if settings.policy:
            policy_flags(settings.policy)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    if settings.runtimes:
        console.print(f"talaria proxy on http://{host}:{port}/v1 — runtimes {settings.runtimes}")
    else:
        console.print(
            f"talaria proxy on http://{host}:{port}/v1 — models {', '.join(settings.models)} "
            f"on {settings.nodes} simulated node(s), time ×{settings.time_scale:g}; "
            "replies are synthetic text from the simulated engine"
        )
    uvicorn.run(create_app(settings), host=host, port=port, log_level=log_level)


@app.command("runtime")
def runtime_server(
    config: Annotated[Path, typer.Option(help="Node configuration TOML (runtime/config.py).")],
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 9000,
    catalog_dirs: CatalogOpt = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
) -> None:
    """Run one node's runtime server: its engines (simulated or vLLM) behind the slot scheduler,
    serving the proxy over HTTP (talaria serve --runtime http://HOST:PORT). SIGTERM drains:
    no new connections, in-flight calls finish, then the engines shut down."""
    import uvicorn

    from talaria.runtime.config import NodeConfigError, load_node_config
    from talaria.runtime.server import create_runtime_app

    try:
        node = load_node_config(config)
        policy_flags(node.policy)
    except (NodeConfigError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    console.print(
        f"talaria runtime {node.name} on http://{host}:{port} — "
        + ", ".join(f"{m.name} ({m.engine})" for m in node.models)
    )
    app_ = create_runtime_app(node, [str(p) for p in catalog_dirs or []])
    uvicorn.run(app_, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=600)


def _register_db() -> None:
    """``talaria db`` needs the proxy extra (SQLAlchemy, Alembic); without it, skip it."""
    try:
        from talaria.proxy.store.cli import db_app
    except ImportError:  # pragma: no cover - only without the proxy extra
        return
    from talaria.proxy.keys_cli import keys_app

    app.add_typer(db_app, name="db", help="Database schema: upgrade, downgrade, current.")
    app.add_typer(keys_app, name="keys", help="API keys: create, list, revoke.")


_register_db()


def main() -> None:
    app()
