"""``talaria calibrate``: measure a running engine and fit the cost model's step time to it."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from talaria.cli.common import console, progress_bar, stdout


def _interference_note(errors: list[float]) -> str:
    """The comment on a measured ``coresident_interference``: how well it predicts."""
    if not errors:
        return ""
    return (
        f" ({len(errors)} points; |prediction error| median "
        f"{statistics.median(errors):.1%}, max {max(errors):.1%})"
    )


def calibrate(
    runtime_url: Annotated[
        str,
        typer.Option(
            "--runtime",
            help="Base URL of a running `talaria runtime` server (its engines); its token, "
            "if it has one, from TALARIA_RUNTIME_TOKEN.",
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
    import os

    from talaria.calibrate_live import run_calibration
    from talaria.core.protocol import RUNTIME_TOKEN_ENV
    from talaria.proxy.runtimes.base import RuntimeUnavailable
    from talaria.sim.calibrate import QUICK_PLAN, CalibrationPlan
    from talaria.sim.fit import profile_toml

    plan = QUICK_PLAN if quick else CalibrationPlan()
    if repeats is not None:
        plan = replace(plan, repeats=repeats)
    with progress_bar("measurements") as bar:
        tasks: dict[str, Any] = {}

        def tick(measured: str, total: int) -> None:
            if measured not in tasks:
                tasks[measured] = bar.add_task(measured, total=total, visible=progress)
            bar.advance(tasks[measured])

        try:
            token = os.environ.get(RUNTIME_TOKEN_ENV, "").strip() or None
            run = asyncio.run(run_calibration(runtime_url, model, plan, tick, token))
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
    stdout().print(table)
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
