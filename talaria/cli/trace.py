"""``talaria trace``: make replay traces (generated, or exported from the proxy's store)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from talaria.cli.common import CatalogOpt, catalog_of, console
from talaria.core.catalog_error import CatalogError
from talaria.core.trace import TraceError, write_trace

trace_app = typer.Typer(help="Make and inspect replay traces (JSONL, one call per line).")


@trace_app.command("generate")
def trace_generate(
    out: Annotated[Path, typer.Option(help="Where to write the JSONL trace.")],
    preset: Annotated[str, typer.Option(help="Workload preset.")] = "paper",
    seed: Annotated[int, typer.Option(help="Generator seed.")] = 0,
    sessions: Annotated[int | None, typer.Option(min=1, help="Override the session count.")] = None,
    catalog_dirs: CatalogOpt = None,
) -> None:
    """Generate a preset's sessions (SWE-bench-like agent sessions, docs/sources.md §2; a
    market's arrivals, sim/market.py) as a replayable trace.

    The generator and the file format: docs/trace-format.md.
    """
    from talaria.sim.presets import get_preset

    catalog = catalog_of(catalog_dirs)
    try:
        chosen = get_preset(preset)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    if sessions is not None:
        chosen = chosen.with_sessions(sessions)
    try:
        traced = chosen.sessions(catalog, seed)
    except (ValueError, CatalogError) as exc:
        raise typer.BadParameter(str(exc)) from exc
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
        typer.Option(
            "--session",
            help="Only this session, by its key (ses_..., the admin API's session_key; "
            "repeatable).",
        ),
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
                session_keys=session,
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
            f"no successful calls of session(s) {', '.join(missing)} (unknown key, or outside "
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
