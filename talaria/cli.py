"""The ``talaria`` command."""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import replace
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from talaria.core.catalog import Catalog, CatalogError, load_catalog
from talaria.core.routing.routers import ROUTER_NAMES, get_router
from talaria.core.trace import SessionTrace, TraceError, read_trace, write_trace
from talaria.core.types import CallResult
from talaria.runtime.scheduling.flags import policy_flags
from talaria.sim.workload import WorkloadSpec, generate_sessions

if TYPE_CHECKING:
    from talaria.proxy.settings import ProxySettings

# Help texts are rich markup: a literal "[" is written "\\[" (else "[profile]" vanishes).
app = typer.Typer(
    help="Talaria: session-aware serving of tool-using agents on shared GPU nodes.",
    no_args_is_help=True,
    add_completion=False,
    # Subcommands (trace, db, keys, ...) inherit the help option names from this context.
    context_settings={"help_option_names": ["-h", "--help"]},
)
trace_app = typer.Typer(help="Make and inspect replay traces (JSONL, one call per line).")
app.add_typer(trace_app, name="trace")
console = Console(stderr=True)

CatalogOpt = Annotated[
    list[Path] | None,
    typer.Option("--catalog", help="Extra directory or TOML file of models/servers/profiles."),
]


def _print_version(value: bool) -> None:
    if not value:
        return
    try:
        number = dist_version("talaria")
    except PackageNotFoundError:  # pragma: no cover - only when run from an uninstalled tree
        from talaria import __version__ as number
    typer.echo(f"talaria {number}")
    raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    pass


def _fail(message: str) -> typer.Exit:
    """Print ``message`` as one plain line on stderr; raise the result to exit with status 1."""
    console.print(message, markup=False, highlight=False, soft_wrap=True)
    return typer.Exit(1)


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


def _interference_note(errors: list[float]) -> str:
    """The comment on a measured ``coresident_interference``: how well it predicts."""
    if not errors:
        return ""
    return (
        f" ({len(errors)} points; |prediction error| median "
        f"{statistics.median(errors):.1%}, max {max(errors):.1%})"
    )


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
            raise _fail(
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
            "node layout, like 'cluster', ignore it).",
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
    from talaria.runtime.scheduling.intake import CallTooLargeError
    from talaria.runtime.scheduling.resources import CapacityError
    from talaria.sim.experiment import run_experiment
    from talaria.sim.policies import resolve_policy
    from talaria.sim.presets import get_preset
    from talaria.sim.report import experiment_table, routing_table, sweep_table
    from talaria.sim.sweep import parse_sweep, run_sweep

    if quantum_s is not None and not (math.isfinite(quantum_s) and quantum_s > 0):
        raise typer.BadParameter(f"must be > 0, got {quantum_s:g}", param_hint="'--quantum-s'")
    profile_file = Path(profile) if profile and profile.endswith(".toml") else None
    catalog = _catalog([*(catalog_dirs or []), *([profile_file] if profile_file else [])])
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
        _check_fits(catalog, setup.server, setup.models)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    try:
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
            if sweeps:
                points = sum(len(v) for _, v in sweeps) * sweep_seeds
                sweep_task = bar.add_task("sweep", total=None, visible=progress)
                bar.update(sweep_task, description=f"sweep ({points} replays of 3 layouts)")

                def sweep_tick(_: CallResult) -> None:
                    bar.advance(sweep_task)

                seeds = range(seed, seed + sweep_seeds)
                rows = run_sweep(chosen, catalog, sweeps, _generate, seeds, sweep_tick)
                doc["sweep"] = rows
    except (CapacityError, CallTooLargeError) as exc:
        # A call's KV cache (a huge prompt in a trace) needs more memory than a node has.
        raise _fail(f"the workload does not fit server {setup.server!r}: {exc}") from None
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
    sessions: Annotated[int | None, typer.Option(min=1, help="Override the session count.")] = None,
    catalog_dirs: CatalogOpt = None,
) -> None:
    """Generate SWE-bench-like sessions (docs/sources.md §2 distributions) as a replayable trace.

    The generator and the file format: docs/trace-format.md.
    """
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


@trace_app.command("export")
def trace_export(
    out: Annotated[
        Path, typer.Option(help="Where to write the JSONL trace; '-' writes it to stdout.")
    ],
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            help="Database URL of the proxy's session store (default: as the proxy: "
            "$TALARIA_DATABASE_URL, else SQLite in the user data directory).",
        ),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            help="Only sessions whose first successful call arrived at or after this: an "
            "ISO-8601 time (naive = UTC) or a duration before now (30m, 2h, 1d)."
        ),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option(
            help="Only sessions whose first successful call arrived before this (same forms "
            "as --since)."
        ),
    ] = None,
    session: Annotated[
        list[str] | None,
        typer.Option("--session", help="Only this session id (repeatable)."),
    ] = None,
) -> None:
    """Export the proxy's stored calls as a replay trace (docs/trace-format.md).

    Whole sessions, successful calls only, renumbered 0..n-1; arrival offsets, tool gaps and new
    tokens come from the stored times and token counts, and every call carries its measured
    latency_s and ttft_s. Replay it against other policies: talaria replay --trace FILE.
    """
    import asyncio
    from datetime import UTC, datetime

    from sqlalchemy.exc import SQLAlchemyError

    from talaria.core.trace import dumps_trace
    from talaria.proxy.store.db import default_url
    from talaria.proxy.store.export import ExportError, export_from_url, parse_time

    now = datetime.now(UTC)
    bounds: dict[str, datetime | None] = {}
    for name, value in (("since", since), ("until", until)):
        try:
            bounds[name] = None if value is None else parse_time(value, now)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint=f"'--{name}'") from exc
    try:
        traced = asyncio.run(
            export_from_url(
                db or default_url(),
                since=bounds["since"],
                until=bounds["until"],
                session_ids=session,
            )
        )
        text = dumps_trace(traced)
    except (SQLAlchemyError, OSError) as exc:
        reason = getattr(exc, "orig", None) or exc
        raise typer.BadParameter(
            f"cannot read the session store: {reason}", param_hint="'--db'"
        ) from exc
    except (ExportError, TraceError) as exc:
        console.print(f"cannot export: {exc}", markup=False, highlight=False)
        raise typer.Exit(1) from exc
    missing = sorted(set(session or ()) - {s.session_id for s in traced})
    if missing:
        raise typer.BadParameter(
            f"no successful calls of session(s) {', '.join(missing)} (unknown id, or outside "
            "--since/--until)",
            param_hint="'--session'",
        )
    if not traced:
        console.print("no sessions to export: no successful calls match the filters")
        raise typer.Exit(1)
    if str(out) == "-":
        typer.echo(text, nl=False)
    else:
        try:
            out.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise typer.BadParameter(str(exc), param_hint="'--out'") from exc
    calls = [c for s in traced for c in s.calls]
    span = max(c.arrival_offset_s + (c.latency_s or 0.0) for c in calls)
    console.print(
        f"exported {len(traced)} sessions, {len(calls)} calls spanning {span:.1f} s "
        f"to {'stdout' if str(out) == '-' else out}",
        highlight=False,
    )


@app.command()
def calibrate(
    runtime_url: Annotated[
        str,
        typer.Option(
            "--runtime", help="Base URL of a running `talaria runtime` server (its engines)."
        ),
    ],
    model: Annotated[
        list[str],
        typer.Option(help="Model to measure (repeatable); one fitted step time per model."),
    ],
    out: Annotated[Path, typer.Option(help="Where to write the profile TOML.")],
    name: Annotated[str, typer.Option(help="Name of the written profile.")] = "calibrated",
    report: Annotated[
        Path | None,
        typer.Option(help="Also write every measurement and its fitted residual (JSON)."),
    ] = None,
    quick: Annotated[
        bool, typer.Option(help="A smaller grid, one pass (CI): about a tenth of the calls.")
    ] = False,
    repeats: Annotated[
        int | None, typer.Option(min=1, help="Passes over the grid (default 3; 1 with --quick).")
    ] = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Measure a running engine and fit the cost model's step time to it.

    Through the runtime's HTTP API: prefill time over prompt lengths and cached-prefix lengths
    (one call at a time), decode step time over batch sizes and context lengths (streamed
    batches). Fits, per model, t = overhead + a·tokens + b·attention pairs + c·sequences (+ a
    per-call intake) by weighted least squares, prints the residuals, and writes a profile
    TOML for `talaria replay --profile FILE`. Measure on a quiet machine: anything else
    running shows up in the figures. Switch and KV-restore times are reported where the
    engine moves memory at a switch (not on vLLM's CPU gate).
    """
    import asyncio

    from talaria.calibrate_live import run_calibration
    from talaria.proxy.http_runtime import RuntimeUnavailable
    from talaria.sim.calibrate import QUICK_PLAN, CalibrationPlan
    from talaria.sim.fit import profile_toml

    plan = QUICK_PLAN if quick else CalibrationPlan()
    if repeats is not None:
        plan = replace(plan, repeats=repeats)
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("measurements"),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        tasks: dict[str, Any] = {}

        def tick(measured: str, total: int) -> None:
            if measured not in tasks:
                tasks[measured] = bar.add_task(measured, total=total, visible=progress)
            bar.advance(tasks[measured])

        try:
            run = asyncio.run(run_calibration(runtime_url, model, plan, tick))
        except (RuntimeUnavailable, ValueError) as exc:
            raise typer.BadParameter(str(exc), param_hint="--runtime/--model") from exc
    table = Table(title=f"fitted step time (profile {name!r})")
    for column in ("model", "samples", "overhead ms", "µs/token", "ns/pair", "µs/seq",
                   "intake ms", "mixed ms", "|resid| median", "|resid| max"):  # fmt: skip
        table.add_column(column, justify="right")
    for m, fit in run.fits.items():
        f = fit.fit
        table.add_row(
            m,
            str(fit.samples),
            f"{f.overhead_s * 1e3:.3f}",
            f"{f.s_per_token * 1e6:.3f}",
            f"{f.s_per_pair * 1e9:.3f}",
            f"{f.s_per_seq * 1e6:.3f}",
            f"{f.call_overhead_s * 1e3:.3f}",
            f"{f.mixed_step_s * 1e3:.3f}",
            f"{fit.median_abs_rel_residual:.1%}",
            f"{fit.max_abs_rel_residual:.1%}",
        )
    _stdout().print(table)
    console.print(f"HTTP hop of a call (median of {len(run.hops_s)}): {run.hop_s * 1e3:.2f} ms")
    if not run.switches_measurable:
        console.print(
            "switch and KV restore: not measured (the engines move nothing at a switch: "
            "vLLM's CPU gate; use server 'cpu-vllm' when replaying)"
        )
    else:
        for m, cal in run.models.items():
            if cal.switch_s:
                console.print(f"{m}: switch_s of its slots: {sorted(cal.switch_s)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        profile_toml(
            name,
            run.fits,
            max_num_batched_tokens=run.max_num_batched_tokens,
            block_tokens=run.block_tokens,
            source=f"runtime {runtime_url}, {plan.repeats} pass(es)",
            hop_s=run.hop_s,
            interference=run.interference,
            interference_note=_interference_note(run.coresident_errors()),
        )
    )
    console.print(f"wrote {out}")
    if report is not None:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(json.dumps(run.report(), indent=1) + "\n")
        console.print(f"wrote {report}")


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
        str | None,
        typer.Option(help=f"Router of the calls: {', '.join(ROUTER_NAMES)} (default: talaria)."),
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
    allow_open: Annotated[
        bool,
        typer.Option(
            "--allow-open",
            help="While no API key is usable, serve every caller without a key (remote ones "
            "too); without it only loopback callers are, and a non-loopback --host with no "
            "key at all is refused.",
        ),
    ] = False,
    durability: Annotated[
        str | None,
        typer.Option(
            help="commit (default): a call's response completes once its records are "
            "committed; async: records are written in the background, faster, and a crash "
            "loses the last moments of them (docs/operations.md).",
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
) -> None:
    """Serve the proxy (embedded simulated runtime, or --runtime URLs).

    It speaks OpenAI chat completions and Responses (base_url http://HOST:PORT/v1) and
    Anthropic Messages (base URL http://HOST:PORT): Claude Code, Codex, Qwen Code and any
    OpenAI or Anthropic client work unchanged (docs/agents.md). Sessions are found by the
    client's own id (X-Talaria-Session-Id, Claude Code's and Codex's session headers,
    prompt_cache_key, ...) or, without one, by the conversation each call continues.
    Settings also come from TALARIA_* environment variables (TALARIA_API_KEYS,
    TALARIA_ADMIN_TOKEN, TALARIA_DATABASE_URL, TALARIA_SESSION_IDLE_TIMEOUT_S, ...). The
    simulated engines time every call with the cost model; their replies are simulated
    (a harmless offered tool, then a \\[simulated] answer). SIGTERM drains within
    TALARIA_DRAIN_TIMEOUT_S (30 s); every setting and failure mode: docs/operations.md.
    """
    import os

    from talaria.core.http_edge import EdgeBounds
    from talaria.proxy import serve as serving
    from talaria.proxy.app import create_app
    from talaria.proxy.settings import ProxySettings
    from talaria.proxy.store.db import default_url
    from talaria.proxy.store.service import location

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
            "allow_open": allow_open or None,
            "durability": durability,
        }.items()
        if value is not None
    }
    if "TALARIA_FREEZE_GC" not in os.environ:
        overrides["freeze_gc"] = True  # see create_app's freeze_startup_objects
    try:
        settings = ProxySettings(**overrides)
        if settings.policy:
            policy_flags(settings.policy)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    # Refuse here what would otherwise fail every call (a 500) or the app's start (a traceback).
    try:
        get_router(settings.router)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--router'") from exc
    if not _is_loopback(host) and not settings.api_keys and not settings.allow_open:
        _refuse_without_keys(settings)
    if settings.runtimes:
        console.print(f"talaria proxy on http://{host}:{port}/v1 — runtimes {settings.runtimes}")
    else:
        _check_embedded(settings)
        console.print(
            f"talaria proxy on http://{host}:{port}/v1 — models {', '.join(settings.models)} "
            f"on {settings.nodes} simulated node(s), time ×{settings.time_scale:g}; "
            "replies are simulated (docs/agents.md)"
        )
    store = location(settings.database_url or default_url())
    console.print(f"session store: {store} (durability: {settings.durability})")
    serving.serve(
        create_app(settings),
        host=host,
        port=port,
        log_level=log_level,
        drain_timeout_s=settings.drain_timeout_s,
        bounds=EdgeBounds(settings.header_timeout_s, settings.max_connections),
    )


def _is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (127.0.0.0/8, ::1) or ``localhost``."""
    import ipaddress

    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _refuse_without_keys(settings: ProxySettings) -> None:
    """A non-loopback address with no key ever (store or TALARIA_API_KEYS): refuse to start."""
    from talaria.proxy.keys_cli import keys_ever_created

    try:
        keys = keys_ever_created(settings.database_url, migrate=settings.auto_migrate)
    except Exception as exc:
        raise typer.BadParameter(
            f"cannot read API keys from the store: {exc}", param_hint="'--host'"
        ) from exc
    if keys == 0:
        raise typer.BadParameter(
            "no API keys: remote callers would all be refused; create one with "
            "'talaria keys create' (or set TALARIA_API_KEYS), or pass --allow-open to serve "
            "everyone without a key",
            param_hint="'--host'",
        )


def _check_embedded(settings: ProxySettings) -> None:
    """The embedded node's models, server and profile must be in the catalog it will load."""
    try:
        cat = load_catalog(settings.catalog_path)
    except CatalogError as exc:
        raise typer.BadParameter(f"cannot load the model catalog: {exc}") from exc
    if not settings.models:
        raise typer.BadParameter("no models for the embedded node", param_hint="'--models'")
    unknown = [m for m in settings.models if m not in cat.models]
    if unknown:
        raise typer.BadParameter(
            f"unknown model(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(sorted(cat.models))}",
            param_hint="'--models'",
        )
    try:
        cat.server(settings.server)
        cat.profile(settings.profile)
    except CatalogError as exc:
        raise typer.BadParameter(str(exc)) from exc


@app.command("runtime")
def runtime_server(
    config: Annotated[Path, typer.Option(help="Node configuration TOML (runtime/config.py).")],
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 9000,
    catalog_dirs: CatalogOpt = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    drain_timeout_s: Annotated[
        float,
        typer.Option(
            min=0.1,
            help="On SIGTERM, how long calls in flight get to finish; the process ends "
            "within this plus 30 s (engine shutdown) whatever happens.",
        ),
    ] = 600.0,
) -> None:
    """Run one node's runtime server: its engines (simulated or vLLM) behind the slot scheduler,
    serving the proxy over HTTP (talaria serve --runtime http://HOST:PORT). SIGTERM drains:
    no new connections, in-flight calls finish, then the engines shut down."""
    from talaria.runtime.config import NodeConfigError, load_node_config
    from talaria.runtime.server import create_runtime_app, serve_runtime

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
    serve_runtime(app_, host, port, log_level, drain_timeout_s)


def _register_db() -> None:
    """``talaria db`` needs the proxy extra (SQLAlchemy, Alembic); without it, skip it."""
    try:
        from talaria.proxy.store.cli import db_app
    except ImportError:  # pragma: no cover - only without the proxy extra
        return
    from talaria.proxy.keys_cli import keys_app

    app.add_typer(db_app, name="db", help="Database schema: upgrade, downgrade, current.")
    app.add_typer(keys_app, name="keys", help="API keys: create, list, revoke, delete.")


_register_db()


def main() -> None:
    app()
