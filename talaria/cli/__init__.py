"""The ``talaria`` command: the root parser, built from one module per command group.

replay.py (``replay``), calibrate.py (``calibrate``), catalog.py (``catalog``), serve.py
(``serve``), runtime.py (``runtime``), trace.py (``trace generate|export``); ``db`` and ``keys``
come from the proxy (proxy/store/cli.py, talaria/cli/keys.py). common.py holds what they share.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version
from typing import Annotated

import typer

from talaria.cli import calibrate, catalog, plan, replay, runtime, serve, trace

app = typer.Typer(
    help="Talaria: session-aware serving of tool-using agents on shared GPU nodes.",
    no_args_is_help=True,
    add_completion=False,
    # Subcommands (trace, db, keys, ...) inherit the help option names from this context.
    context_settings={"help_option_names": ["-h", "--help"]},
)


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


app.command()(replay.replay)
app.command()(plan.plan)
app.command()(calibrate.calibrate)
app.command()(catalog.catalog)
app.command()(serve.serve)
app.command("runtime")(runtime.runtime_server)
app.add_typer(trace.trace_app, name="trace")


def _register_db() -> None:
    """``talaria db`` needs the proxy extra (SQLAlchemy, Alembic); without it, skip it."""
    try:
        from talaria.proxy.store.cli import db_app
    except ImportError:  # pragma: no cover - only without the proxy extra
        return
    from talaria.cli.keys import keys_app

    app.add_typer(db_app, name="db", help="Database schema: upgrade, downgrade, current.")
    app.add_typer(keys_app, name="keys", help="API keys: create, list, revoke, delete.")


_register_db()


def main() -> None:
    """Run the ``talaria`` command (the console script's entry point)."""
    app()
