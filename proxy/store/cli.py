"""``talaria db``: migrate the session store and show its revision."""

from __future__ import annotations

from typing import Annotated

import typer

from talaria.proxy.store import migrate
from talaria.proxy.store.db import DATABASE_URL_ENV, default_url

db_app = typer.Typer(
    help=f"Session store migrations. The database is --url, else ${DATABASE_URL_ENV}, "
    "else SQLite in the user data directory.",
    no_args_is_help=True,
)

UrlOpt = Annotated[
    str | None,
    typer.Option("--url", help=f"Database URL (default: ${DATABASE_URL_ENV} or local SQLite)."),
]


def _url(url: str | None) -> str:
    return url or default_url()


@db_app.command()
def upgrade(
    url: UrlOpt = None,
    revision: Annotated[str, typer.Option("--revision", help="Target revision.")] = "head",
) -> None:
    """Migrate the database up to a revision (default: the newest)."""
    target = _url(url)
    migrate.upgrade(target, revision)
    typer.echo(f"database at revision {migrate.current(target) or 'base'}")


@db_app.command()
def downgrade(
    revision: Annotated[str, typer.Option("--revision", help="Target revision ('base': empty).")],
    url: UrlOpt = None,
) -> None:
    """Migrate the database down to a revision."""
    target = _url(url)
    migrate.downgrade(target, revision)
    typer.echo(f"database at revision {migrate.current(target) or 'base'}")


@db_app.command()
def current(url: UrlOpt = None) -> None:
    """Print the database's revision ('none' if it was never migrated) and the newest one."""
    rev = migrate.current(_url(url))
    typer.echo(f"current: {rev or 'none'}")
    typer.echo(f"head: {migrate.head() or 'none'}")
