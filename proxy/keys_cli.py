"""``talaria keys``: API keys kept (hashed) in the session store."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

import typer

from talaria.proxy.store.db import default_url, make_engine, make_sessionmaker
from talaria.proxy.store.migrate import upgrade_async
from talaria.proxy.store.repository import SqlStore

T = TypeVar("T")

keys_app = typer.Typer(
    help="API keys in the session store (the proxy then requires one on every call).",
    no_args_is_help=True,
)
UrlOpt = Annotated[
    str | None,
    typer.Option("--url", help="Database URL (default: $TALARIA_DATABASE_URL or local SQLite)."),
]


def _with_store(url: str | None, action: Callable[[SqlStore], Awaitable[T]]) -> T:
    async def main() -> T:
        target = url or default_url()
        await upgrade_async(target)
        engine = make_engine(target)
        try:
            return await action(SqlStore(make_sessionmaker(engine)))
        finally:
            await engine.dispose()

    return asyncio.run(main())


@keys_app.command()
def create(
    tenant: Annotated[str, typer.Option(help="Tenant name (created if new).")] = "default",
    url: UrlOpt = None,
) -> None:
    """Create a key for TENANT and print it once (only its hash is stored)."""

    async def action(store: SqlStore) -> str:
        return await store.create_api_key(await store.create_tenant(tenant))

    key = _with_store(url, action)
    typer.echo(key)


@keys_app.command("list")
def list_keys(url: UrlOpt = None) -> None:
    """List keys: id, tenant, prefix, created, revoked."""
    for info in _with_store(url, lambda store: store.list_api_keys()):
        revoked = info.revoked_at.isoformat() if info.revoked_at else "-"
        typer.echo(
            f"{info.id}  tenant={info.tenant_id}  {info.prefix}…  "
            f"created={info.created_at.isoformat()}  revoked={revoked}"
        )


@keys_app.command()
def revoke(
    key_id: Annotated[str, typer.Argument(help="Key id from 'keys list'.")], url: UrlOpt = None
) -> None:
    """Revoke a key (the proxy stops accepting it within 30 s)."""
    if not _with_store(url, lambda store: store.revoke_api_key(key_id)):
        typer.echo(f"no active key {key_id}", err=True)
        raise typer.Exit(1)
    typer.echo(f"revoked {key_id}")
