"""``talaria plan``: the fewest nodes (and GPUs) that meet an SLO on session completion time,
for talaria with its placement controller, for a static packing of the models and for
dedicated nodes (sim/plan.py)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from talaria.cli.common import CatalogOpt, catalog_of, console, fail, generate, progress_bar, stdout
from talaria.core.catalog import CatalogError


def plan(
    preset: Annotated[
        str, typer.Option(help="Workload and models: a preset name ('fleet', 'cluster', ...).")
    ] = "fleet",
    seed: Annotated[int, typer.Option(help="Seed of the workload generator.")] = 0,
    slo_x: Annotated[
        float,
        typer.Option(
            min=1.0,
            help="SLO: p95 SCT ≤ this × the p95 SCT of dedicated nodes, one per model.",
        ),
    ] = 1.5,
    slo_p95_s: Annotated[
        float | None,
        typer.Option(min=0.0, help="SLO: p95 SCT ≤ this many seconds (instead of --slo-x)."),
    ] = None,
    max_nodes: Annotated[
        int | None,
        typer.Option(min=1, help="Most nodes to try (default: twice the model count)."),
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
    catalog_dirs: CatalogOpt = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Find how many 8-GPU nodes the preset's sessions need to meet a p95 SCT SLO.

    Replays the sessions at every node count that holds the models' weights on a packing of
    the models by demand, fixed (static) and moved by the placement controller (talaria),
    and on dedicated nodes (each model on its own, one more node at a time for the model
    worst off), and prints the fewest nodes of each that meets the SLO. The JSON document
    has plans.talaria.nodes, plans.static.nodes and plans.dedicated.nodes (null when no
    count up to --max-nodes meets it), the SLO, the layouts found (talaria's: where it
    started and ended, and its moves by reason) and every replay's SCTs.
    """
    from talaria.sim.plan import Point
    from talaria.sim.plan import plan as make_plan
    from talaria.sim.presets import get_preset

    catalog = catalog_of(list(catalog_dirs or []))
    try:
        chosen = get_preset(preset)
        workload = chosen.workload
        if sessions is not None:
            total = (
                round(workload.total_calls / workload.sessions * sessions)
                if workload.total_calls
                else None
            )
            workload = replace(workload, sessions=sessions, total_calls=total)
        traces = generate(workload, catalog, seed)
    except (ValueError, CatalogError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    gpus = catalog.server(chosen.server).gpus
    started = time.perf_counter()
    with progress_bar("replays") as bar:
        task = bar.add_task("plan", total=None, visible=progress)

        def tick(point: Point) -> None:
            bar.advance(task)
            bar.update(task, description=f"plan: {point.family} {point.nodes} nodes")

        try:
            doc = make_plan(
                traces,
                catalog,
                chosen.server,
                chosen.profile,
                chosen.quantum_s,
                workload.models,
                slo_x=slo_x,
                slo_p95_s=slo_p95_s,
                max_nodes=max_nodes,
                jobs=jobs,
                on_point=tick,
            )
        except CatalogError as exc:
            raise fail(str(exc)) from None
    doc.update(preset=chosen.name, seed=seed, sessions=len(traces), gpus_per_node=gpus)
    for found in doc["plans"].values():
        if found is not None:
            found["gpus"] = found["nodes"] * gpus
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
    how = f"{slo['x']:g} × dedicated's p95" if slo["x"] is not None else "as given"
    table = Table(
        title=f"Nodes needed: p95 SCT ≤ {slo['p95_sct_s']:,.1f} s ({how}); preset "
        f"{doc['preset']}, seed {doc['seed']}, {doc['sessions']} sessions"
    )
    for column in ("layout", "nodes", "GPUs", "p50 SCT s", "p95 SCT s", "÷ dedicated nodes"):
        table.add_column(column, justify="left" if column == "layout" else "right")
    dedicated = doc["plans"]["dedicated"]
    for family, found in doc["plans"].items():
        if found is None:
            table.add_row(family, f"> {doc['max_nodes']}", "–", "–", "–", "–")
            continue
        share = f"{found['nodes'] / dedicated['nodes']:.2f}" if dedicated else "–"
        table.add_row(
            family,
            str(found["nodes"]),
            str(found["gpus"]),
            f"{found['p50_sct_s']:,.1f}",
            f"{found['p95_sct_s']:,.1f}",
            share,
        )
    return table
