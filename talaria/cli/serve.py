"""``talaria serve``: the proxy, with an embedded simulated runtime or ``--runtime`` URLs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from talaria.cli.common import console
from talaria.core.catalog import CatalogError, load_catalog
from talaria.core.routing.routers import ROUTER_NAMES, get_router
from talaria.runtime.scheduling.flags import policy_flags

if TYPE_CHECKING:
    from talaria.proxy.settings import ProxySettings


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
