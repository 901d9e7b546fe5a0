"""``talaria keys``: API keys kept (hashed) in the session store."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

import typer

from talaria.core.protocol_calls import MAX_TENANT_WEIGHT
from talaria.core.types import Priority
from talaria.proxy.callpath.auth import MODE_TTL_S
from talaria.proxy.store.db import default_url, make_engine, make_sessionmaker
from talaria.proxy.store.migrate import upgrade_async
from talaria.proxy.store.tenants import (
    MAX_RATE_LIMIT,
    TenantTables,
    key_ceiling,
    key_limit,
    key_share,
)

T = TypeVar("T")

CLOSED_FOR_GOOD = (
    "Revoked and deleted keys still count as keys: a proxy whose keys are all revoked or deleted "
    "serves nobody until a key is created, or it is restarted with --allow-open."
)
keys_app = typer.Typer(
    help="API keys in the session store (the proxy then requires one on every call; it notices "
    f"a new key within {MODE_TTL_S:g} s). " + CLOSED_FOR_GOOD,
    no_args_is_help=True,
)
UrlOpt = Annotated[
    str | None,
    typer.Option("--url", help="Database URL (default: $TALARIA_DATABASE_URL or local SQLite)."),
]
KeyIdArg = Annotated[str, typer.Argument(help="Key id from 'keys list'.")]


def _with_store(
    url: str | None, action: Callable[[TenantTables], Awaitable[T]], *, migrate: bool = True
) -> T:
    async def main() -> T:
        target = url or default_url()
        if migrate:
            await upgrade_async(target)
        engine = make_engine(target)
        try:
            return await action(TenantTables(make_sessionmaker(engine)))
        finally:
            await engine.dispose()

    return asyncio.run(main())


def keys_ever_created(url: str | None, *, migrate: bool = True) -> int:
    """How many keys the store at ``url`` ever had (revoked and deleted ones included); the
    store is migrated first (as every ``keys`` command does) unless ``migrate`` is false."""
    return _with_store(url, lambda store: store.count_api_keys(), migrate=migrate)


PRIORITIES = ", ".join(p.value for p in Priority)


def _checked_priority(value: str) -> str:
    try:
        return key_share(priority=value).priority.value
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


def _checked_ceiling(priority: str, value: str | None) -> str | None:
    """``--max-priority`` checked against ``--priority`` (once both are parsed, whichever
    order they came in): a usage error (exit 2) naming the fault."""
    try:
        ceiling = key_ceiling(priority, value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--max-priority'") from exc
    return None if ceiling is None else ceiling.value


def _checked_weight(value: float) -> float:
    try:
        return key_share(weight=value).weight
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


def _checked_limit(ctx: typer.Context, param: typer.CallbackParam, value: int | None) -> int | None:
    try:
        return key_limit(param.name or "limit", value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


@keys_app.command()
def create(
    tenant: Annotated[str, typer.Option(help="Tenant name (created if new).")] = "default",
    priority: Annotated[
        str,
        typer.Option(
            help=f"The class of the key's calls unless their X-Talaria-Priority header asks "
            f"another (within --max-priority): {PRIORITIES}.",
            callback=_checked_priority,
        ),
    ] = Priority.STANDARD.value,
    max_priority: Annotated[
        str | None,
        typer.Option(
            help="The highest class the key's calls may ask with X-Talaria-Priority; a header "
            "asking a higher one is served in this one. Default: the key's --priority (a "
            f"header may lower the class, never raise it). One of {PRIORITIES}, at least as "
            "high as --priority.",
        ),
    ] = None,
    weight: Annotated[
        float,
        typer.Option(
            help="The tenant's share weight in each node's fair queue while it is busy, "
            f"above 0 and at most {MAX_TENANT_WEIGHT:g} (a tenant of weight 2 gets twice the "
            "service of one of weight 1).",
            callback=_checked_weight,
        ),
    ] = 1.0,
    rpm: Annotated[
        int | None,
        typer.Option(
            help="Calls the key may start per minute (UTC minutes, counted across replicas); "
            f"1 to {MAX_RATE_LIMIT}; past it a call gets 429 with Retry-After. Default: no "
            "limit.",
            callback=_checked_limit,
        ),
    ] = None,
    tpm: Annotated[
        int | None,
        typer.Option(
            help="Tokens (prompt + output, counted as each call ends) the key's calls may use "
            f"per minute; 1 to {MAX_RATE_LIMIT}; once reached, new calls get 429 with "
            "Retry-After. Default: no limit.",
            callback=_checked_limit,
        ),
    ] = None,
    normalise_prompts: Annotated[
        bool | None,
        typer.Option(
            "--normalise-prompts/--no-normalise-prompts",
            help="Whether the engine gets the key's calls' prompts without their volatile "
            "parts (Claude Code's attribution line, TALARIA_PROMPT_PATTERNS); sessions are "
            "found without them either way. Default: as TALARIA_NORMALISE_PROMPTS says.",
        ),
    ] = None,
    url: UrlOpt = None,
) -> None:
    """Create a key for TENANT and print it once (only its hash is stored). A bad --priority,
    --max-priority, --weight, --rpm or --tpm is refused (exit 2) before the store is touched:
    nothing is created."""
    max_priority = _checked_ceiling(priority, max_priority)

    async def action(store: TenantTables) -> str:
        tenant_id = await store.create_tenant(tenant)
        return await store.create_api_key(
            tenant_id,
            priority=priority,
            weight=weight,
            rpm=rpm,
            tpm=tpm,
            normalise_prompts=normalise_prompts,
            max_priority=max_priority,
        )

    key = _with_store(url, action)
    typer.echo(key)


@keys_app.command("list")
def list_keys(
    url: UrlOpt = None,
    all_keys: Annotated[
        bool, typer.Option("--all", help="Show deleted keys too (marked 'deleted').")
    ] = False,
) -> None:
    """List keys: id, tenant name, prefix, priority, weight, rpm, tpm ('-': no limit),
    normalise (on, off, '-': as the server says), max priority (the highest class its calls may
    ask), created, revoked (deleted keys only with --all)."""
    infos = _with_store(url, lambda store: store.list_api_keys(include_deleted=all_keys))
    for info in infos:
        revoked = info.revoked_at.isoformat() if info.revoked_at else "-"
        deleted = "  deleted" if info.deleted else ""
        typer.echo(
            f"{info.id}  tenant={info.tenant_name}  {info.prefix}…  priority={info.priority}  "
            f"weight={info.weight:g}  rpm={_limit(info.rpm)}  tpm={_limit(info.tpm)}  "
            f"normalise={_switch(info.normalise_prompts)}  "
            f"max_priority={info.max_priority or info.priority}  "
            f"created={info.created_at.isoformat()}  "
            f"revoked={revoked}{deleted}"
        )


def _limit(value: int | None) -> str:
    return "-" if value is None else str(value)


def _switch(value: bool | None) -> str:
    return "-" if value is None else ("on" if value else "off")


@keys_app.command(
    help=f"Revoke a key (the proxy stops accepting it within 30 s). {CLOSED_FOR_GOOD}"
)
def revoke(key_id: KeyIdArg, url: UrlOpt = None) -> None:
    """``talaria keys revoke KEY_ID`` (its help is the decorator's): exit 1 if no active key."""
    if not _with_store(url, lambda store: store.revoke_api_key(key_id)):
        typer.echo(f"no active key {key_id}", err=True)
        raise typer.Exit(1)
    typer.echo(f"revoked {key_id}")


@keys_app.command(
    help="Delete a key (revoked, and hidden from 'keys list'; the proxy stops accepting it "
    "within 30 s). Its row stays as a tombstone without the key's hash, so the store still "
    f"knows a key existed. {CLOSED_FOR_GOOD}"
)
def delete(key_id: KeyIdArg, url: UrlOpt = None) -> None:
    """``talaria keys delete KEY_ID`` (its help is the decorator's): exit 1 if no such key."""
    if not _with_store(url, lambda store: store.delete_api_key(key_id)):
        typer.echo(f"no key {key_id} (or it is deleted already)", err=True)
        raise typer.Exit(1)
    typer.echo(f"deleted {key_id}")
