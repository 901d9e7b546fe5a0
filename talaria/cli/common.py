"""What the ``talaria`` commands share: the stderr console, the ``--catalog`` option, error exits,
the loopback test of ``--host``, stdout tables, the progress bar and the workload generator
call."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from talaria.core.catalog import Catalog, load_catalog
from talaria.core.catalog_error import CatalogError
from talaria.core.trace import SessionTrace
from talaria.sim.workload import WorkloadSpec, generate_sessions

# Help texts are rich markup: a literal "[" is written "\\[" (else "[profile]" vanishes).

console = Console(stderr=True)
"""Messages (progress, "wrote FILE", failures) go to stderr; tables go to :func:`stdout`."""

CatalogOpt = Annotated[
    list[Path] | None,
    typer.Option("--catalog", help="Extra directory or TOML file of models/servers/profiles."),
]


def fail(message: str) -> typer.Exit:
    """Print ``message`` as one plain line on stderr; raise the result to exit with status 1."""
    console.print(message, markup=False, highlight=False, soft_wrap=True)
    return typer.Exit(1)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (127.0.0.0/8, ::1) or ``localhost``: what
    ``talaria serve`` and ``talaria runtime`` may listen on with no key or token."""
    import ipaddress

    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def catalog_of(extra: list[Path] | None) -> Catalog:
    """The built-in catalog plus the ``--catalog`` paths; a bad file is a usage error."""
    try:
        return load_catalog(extra or [])
    except CatalogError as exc:
        raise typer.BadParameter(str(exc)) from exc


def generate(spec: WorkloadSpec, catalog: Catalog, seed: int) -> list[SessionTrace]:
    """The sessions of ``spec`` drawn with ``seed``, sized by the catalog's models."""
    models = [catalog.model(m) for m in spec.models]
    return generate_sessions(
        spec,
        {m.name: m.context_window_tokens for m in models},
        {m.name: m.reasoning for m in models},
        seed,
    )


def stdout() -> Console:
    """Tables go to stdout, full width even when piped to a file."""
    out = Console()
    return out if out.is_terminal else Console(width=200)


def progress_bar(unit: str) -> Progress:
    """A progress bar on stderr counting ``unit`` (calls, measurements) with the elapsed time."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(unit),
        TimeElapsedColumn(),
        console=console,
    )
