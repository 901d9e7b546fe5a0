"""``talaria plan``: the fewest GPUs that meet an SLO on session completion time, for talaria
(GPU groups shared), for a static packing of the models onto whole nodes, for dedicated GPU
groups of the right size and for dedicated whole nodes (sim/plan.py)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from talaria.cli.common import CatalogOpt, catalog_of, console, fail, progress_bar, stdout
from talaria.core.catalog import Catalog
from talaria.core.catalog_error import CatalogError
from talaria.core.groups import smallest_group
from talaria.core.trace import SessionTrace, TraceError, read_trace


def plan(
    preset: Annotated[
        str, typer.Option(help="Workload and models: a preset name ('fleet', 'cluster', ...).")
    ] = "fleet",
    seed: Annotated[int, typer.Option(help="Seed of the workload generator.")] = 0,
    slo_x: Annotated[
        float,
        typer.Option(
            min=1.0,
            help="SLO: each model's p95 SCT ≤ this × its p95 SCT on a whole node of its own.",
        ),
    ] = 1.5,
    slo_p95_s: Annotated[
        float | None,
        typer.Option(
            min=0.0, help="SLO: every model's p95 SCT ≤ this many seconds (instead of --slo-x)."
        ),
    ] = None,
    max_nodes: Annotated[
        int | None,
        typer.Option(min=1, help="Most whole nodes' GPUs to try (default: twice the model count)."),
    ] = None,
    sessions: Annotated[
        int | None, typer.Option(min=1, help="Sessions to generate (default: the preset's).")
    ] = None,
    jobs: Annotated[
        int,
        typer.Option(min=1, help="Replays run at once, in processes (default: the CPU count)."),
    ] = os.cpu_count() or 1,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the plan document here.")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="Write a PNG: GPUs needed against the SLO, per family.")
    ] = None,
    trace: Annotated[
        Path | None,
        typer.Option(
            help="Plan this JSONL trace's sessions instead of the preset's (docs/trace-format.md); "
            "the preset gives the server, profile and quantum."
        ),
    ] = None,
    models: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated models listed beside the sessions' own (with no session in "
            "the window, still served at least once by dedicated; 'base@name' is a variant)."
        ),
    ] = None,
    catalog_dirs: CatalogOpt = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Find how many GPUs the preset's sessions need to meet a p95 SCT SLO on every model.

    Replays the sessions on five families of layouts and prints the fewest GPUs of each that
    meets the SLO: dedicated_node (every model on whole 8-GPU nodes of its own, one more for the
    model worst off); dedicated (every model on GPU groups of the right size: from the fewest
    GPUs that hold its weights and one full-context sequence, 1, 2, 4 or 8, the model worst off
    gets one more replica or groups twice as large); serverless (request-level instances with
    a fixed 60 s keep-alive and no session awareness: its own right-sized groups, then its
    coldest models pooled on one or two whole nodes); static (the models packed by demand onto
    whole nodes, fewest first, up to the GPUs of the dedicated plan); talaria (the coldest
    models pooled on one or two whole nodes, their weights woken from host DRAM or local NVMe,
    then models moved, coldest first, into another model's group, each move kept only while the
    SLO is still met; or any other layout above that the talaria policy serves with fewer
    GPUs). The JSON document has plans.{talaria,serverless,static,dedicated,dedicated_node}.gpus
    (a plan is null when nothing up to --max-nodes' GPUs meets it) with each plan's groups
    (models, group GPUs, replicas), its weights' loads by tier (loads_by_tier) and each model's
    SLO attainment (slo_by_model), the SLO's bound per model, the listed models, the memory
    minimum, and every replay's p95 per model.
    """
    from talaria.sim.plan import plan as make_plan
    from talaria.sim.plan_replay import Point
    from talaria.sim.presets import get_preset

    catalog = catalog_of(list(catalog_dirs or []))
    try:
        chosen = get_preset(preset)
        if sessions is not None:
            chosen = chosen.with_sessions(sessions)
        traces = read_trace(trace) if trace is not None else chosen.sessions(catalog, seed)
        listed = _listed_models(
            chosen.workload.models if trace is None else (), traces, models, catalog
        )
        server = catalog.server(chosen.server)
        for model in listed:  # a model no group of the server holds: one line, nothing replayed
            smallest_group(catalog.model(model), server)
    except (ValueError, CatalogError, TraceError, OSError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    started = time.perf_counter()
    with progress_bar("replays") as bar:
        task = bar.add_task("plan", total=None, visible=progress)

        def tick(point: Point) -> None:
            bar.advance(task)
            bar.update(task, description=f"plan: {point.family} {point.gpus} GPUs")

        try:
            doc = make_plan(
                traces,
                catalog,
                chosen.server,
                chosen.profile,
                chosen.quantum_s,
                listed,
                slo_x=slo_x,
                slo_p95_s=slo_p95_s,
                max_nodes=max_nodes,
                jobs=jobs,
                on_point=tick,
            )
        except CatalogError as exc:
            raise fail(str(exc)) from None
    doc.update(
        preset=chosen.name,
        seed=seed if trace is None else None,
        trace=str(trace) if trace is not None else None,
        sessions=len(traces),
        models=list(listed),
    )
    out = stdout()
    out.print(_plan_table(doc))
    console.print(f"planned in {time.perf_counter() - started:.1f} s wall ({jobs} at once)")
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        console.print(f"wrote {json_out}")
    if plot is not None:
        from talaria.sim.plots import plot_plan

        plot_plan(doc, plot)
        console.print(f"wrote {plot}")


def _plan_table(doc: dict[str, Any]) -> Table:
    slo = doc["slo"]
    how = (
        f"{slo['x']:g} × its p95 on a whole node of its own"
        if slo["x"] is not None
        else f"{slo['p95_sct_s']:,.1f} s"
    )
    source = (
        f"trace {doc['trace']}"
        if doc.get("trace")
        else f"preset {doc['preset']}, seed {doc['seed']}"
    )
    table = Table(
        title=f"GPUs needed: every model's p95 SCT ≤ {how}; {source}, {doc['sessions']} "
        f"sessions, {len(doc['models'])} models; memory minimum "
        f"{doc['memory_minimum']['gpus']} GPUs"
    )
    columns = ("layout", "GPUs", "groups (GPUs × count)", "p50 SCT s", "p95 SCT s",
               "÷ dedicated GPUs")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column == "layout" else "right")
    dedicated = doc["plans"]["dedicated"]
    for family, found in doc["plans"].items():
        if found is None:  # nothing evaluated meets it, up to the family's bound
            nodes = doc["static_max_nodes"] if family == "static" else doc["max_nodes"]
            most = nodes * doc["gpus_per_node"]
            most = doc["serverless_max_gpus"] if family == "serverless" else most
            table.add_row(family, f"> {most}", "–", "–", "–", "–")
            continue
        share = f"{found['gpus'] / dedicated['gpus']:.2f}" if dedicated else "–"
        table.add_row(
            family,
            str(found["gpus"]),
            _group_counts(found["gpus_per_node"]),
            f"{found['p50_sct_s']:,.1f}",
            f"{found['p95_sct_s']:,.1f}",
            share,
        )
    return table


def _listed_models(
    preset_models: Sequence[str],
    traces: Sequence[SessionTrace],
    extra: str | None,
    catalog: Catalog,
) -> tuple[str, ...]:
    """The models the plan serves: the preset's listed ones (none for a trace), the sessions',
    then ``--models``' (comma-separated), each once and in the catalog (a variant of a known
    base included: ``Catalog.model`` says which name it does not know)."""
    named = [m.strip() for m in (extra or "").split(",") if m.strip()]
    listed = tuple(dict.fromkeys([*preset_models, *(s.model for s in traces), *named]))
    for model in listed:
        catalog.model(model)
    if not listed:
        raise ValueError("no model to plan: the trace has no session and --models names none")
    return listed


def _group_counts(gpus_per_node: list[int]) -> str:
    """``8×3 4×2``: groups of each size, largest first."""
    sizes = sorted(set(gpus_per_node), reverse=True)
    return " ".join(f"{size}×{gpus_per_node.count(size)}" for size in sizes)
