"""``talaria serve``: the proxy, with an embedded simulated runtime or ``--runtime`` URLs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from talaria.cli.common import console, is_loopback
from talaria.cli.runtime import (
    ChatTemplateOpt,
    MaxModelLenOpt,
    ModelOpt,
    ReasoningParserOpt,
    ToolParserOpt,
)
from talaria.core.catalog import load_catalog
from talaria.core.catalog_error import CatalogError
from talaria.core.routing.routers import ROUTER_NAMES, get_router
from talaria.runtime.scheduling.flags import policy_flags

if TYPE_CHECKING:
    from talaria.proxy.contract.settings import ProxySettings


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
        str | None,
        typer.Option(
            help="Comma-separated catalog models of the embedded simulated node(s) (no "
            "weights: replies are simulated). For real weights use --model PATH."
        ),
    ] = None,
    model: ModelOpt = None,
    tool_parser: ToolParserOpt = None,
    reasoning_parser: ReasoningParserOpt = None,
    chat_template: ChatTemplateOpt = None,
    max_model_len: MaxModelLenOpt = None,
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
            help="URL of a runtime server (talaria runtime), repeatable; the token they "
            "require goes in TALARIA_RUNTIME_TOKEN. Without any, the proxy runs an embedded "
            "simulated runtime.",
        ),
    ] = None,
    upstream: Annotated[
        list[str] | None,
        typer.Option(
            "--upstream",
            help="URL of an OpenAI-compatible server that already runs (vllm serve, SGLang, "
            "llama.cpp), repeatable: its models (from its /v1/models) are served through a "
            "runtime of upstream engines that this command starts (docs/upstream.md). Servers "
            "of the same model are its replicas: a runtime each, and each session's calls stay "
            "on one.",
        ),
    ] = None,
    upstream_sleep: Annotated[
        str,
        typer.Option(
            help="With --upstream: how the node switches the servers: none (each keeps its "
            "memory; the node only orders calls), vllm (/sleep and /wake_up: the server runs "
            "with VLLM_SERVER_DEV_MODE=1) or sglang (memory occupation endpoints)."
        ),
    ] = "none",
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
    placement_library: Annotated[
        Path | None,
        typer.Option(
            help="With --runtime: a TOML file of \\[\\[model]] entries that a placement "
            "controller moves between the runtimes by demand (cold-starting one on its first "
            "call); docs/operations.md, 'Placement'.",
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
) -> None:
    """Serve the proxy: over an embedded simulated runtime (--models), over a vLLM runtime it
    starts for real weights (--model PATH), over OpenAI-compatible servers that already run
    (--upstream URL), or over runtime servers (--runtime URL).

    It speaks OpenAI chat completions and Responses (base_url http://HOST:PORT/v1) and
    Anthropic Messages (base URL http://HOST:PORT): Claude Code, Codex, Qwen Code and any
    OpenAI or Anthropic client work unchanged (docs/agents.md). Sessions are found by the
    client's own id (X-Talaria-Session-Id, Claude Code's and Codex's session headers,
    prompt_cache_key, ...) or, without one, by the conversation each call continues.
    Settings also come from TALARIA_* environment variables (TALARIA_API_KEYS,
    TALARIA_ADMIN_TOKEN, TALARIA_DATABASE_URL, TALARIA_SESSION_IDLE_TIMEOUT_S, ...). The
    simulated engines time every call with the cost model; their replies are simulated
    (a harmless offered tool, then a \\[simulated] answer). With --model, a model directory
    or .gguf file is served by vLLM in a `talaria runtime` child process that this command
    starts, watches and stops (docs/models.md). SIGTERM drains within
    TALARIA_DRAIN_TIMEOUT_S (30 s); every setting and failure mode: docs/operations.md.
    """
    import os

    from talaria.proxy.contract.settings import ProxySettings
    from talaria.proxy.edge.settings import check_settings
    from talaria.proxy.placement.settings import PlacementSettings
    from talaria.proxy.sessions.identity import session_sources
    from talaria.proxy.sessions.normalise import prompt_parts

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
            "placement_library": str(placement_library) if placement_library else None,
        }.items()
        if value is not None
    }
    if "TALARIA_FREEZE_GC" not in os.environ:
        overrides["freeze_gc"] = True  # see create_app's freeze_startup_objects
    try:
        settings = ProxySettings(**overrides)
        if settings.policy:
            policy_flags(settings.policy)
        session_sources(settings.session_headers)
        prompt_parts(settings.prompt_patterns)
        check_settings(settings)  # the plugins' (placement's, the Responses dialect's)
        placement = PlacementSettings.of(settings)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    # Refuse here what would otherwise fail every call (a 500) or the app's start (a traceback).
    try:
        get_router(settings.router)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--router'") from exc
    if not is_loopback(host) and not settings.api_keys and not settings.allow_open:
        _refuse_without_keys(settings)
    if model:
        if runtime or models:
            raise typer.BadParameter(
                "--model starts its own runtime: leave out --runtime and --models",
                param_hint="'--model'",
            )
        from talaria.cli.runtime import require_vllm

        require_vllm()
        args = _runtime_args(
            model, tool_parser, reasoning_parser, chat_template, max_model_len, log_level
        )
        console.print(f"starting the vLLM runtime for {', '.join(model)}")
        _serve_over_child(settings, args, host, port, log_level)
        return
    if upstream:
        if runtime or models:
            raise typer.BadParameter(
                "--upstream starts its own runtime: leave out --runtime and --models",
                param_hint="'--upstream'",
            )
        _serve_upstreams(settings, upstream, upstream_sleep, host, port, log_level)
        return
    if placement.placement_library is not None:
        _check_placement(settings, placement.placement_library)
    if settings.runtimes:
        console.print(f"talaria proxy on http://{host}:{port}/v1 — runtimes {settings.runtimes}")
    else:
        _check_embedded(settings)
        console.print(
            f"talaria proxy on http://{host}:{port}/v1 — models {', '.join(settings.models)} "
            f"on {settings.nodes} simulated node(s), time ×{settings.time_scale:g}; "
            "replies are simulated (docs/agents.md)"
        )
    _serve(settings, host, port, log_level)


def _serve(settings: ProxySettings, host: str, port: int, log_level: str) -> None:
    """Run the proxy of ``settings`` until SIGTERM / SIGINT."""
    from talaria.core.http_edge import EdgeBounds
    from talaria.proxy.edge import serve as serving
    from talaria.proxy.edge.app import create_app
    from talaria.proxy.store.db import default_url
    from talaria.proxy.store.service import location

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


RUNTIME_READY_S = 900.0
"""How long ``--model``'s runtime may take to start: a GGUF conversion (~30 s for SmolLM2-135M
on 2 cores) and each vLLM engine's start (~20-60 s on a CPU; minutes for 100B+ on GPUs)."""


def _runtime_args(
    models: list[str],
    tool_parser: str | None,
    reasoning_parser: str | None,
    chat_template: Path | None,
    max_model_len: int | None,
    log_level: str,
) -> list[str]:
    """``talaria runtime``'s arguments for the ``--model`` options."""
    args = [arg for spec in models for arg in ("--model", spec)]
    named = {
        "--tool-parser": tool_parser,
        "--reasoning-parser": reasoning_parser,
        "--chat-template": str(chat_template) if chat_template else None,
        "--max-model-len": str(max_model_len) if max_model_len else None,
    }
    args += [arg for flag, value in named.items() if value for arg in (flag, value)]
    return [*args, "--log-level", log_level]


def _serve_upstreams(
    settings: ProxySettings, urls: list[str], sleep: str, host: str, port: int, log_level: str
) -> None:
    """Serve the models of running servers (cli/upstream.py) through child runtimes: one, or
    one per replica node when a model has several servers (``replica_nodes``)."""
    import tempfile

    from talaria.cli.upstream import UpstreamError, discover, node_toml, replica_nodes

    try:
        found = discover(urls)
        nodes = replica_nodes(found)
        names = ["upstream"] if len(nodes) == 1 else [f"upstream-{i}" for i in range(len(nodes))]
        configs = [
            node_toml(node, sleep, settings.policy, name)
            for node, name in zip(nodes, names, strict=True)
        ]
    except UpstreamError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--upstream'") from exc
    for name, node in zip(names, nodes, strict=True):
        for upstream in node:
            console.print(f"upstream {upstream.url}: {', '.join(upstream.models)} (node {name})")
    with tempfile.TemporaryDirectory(prefix="talaria-upstream-") as folder:
        arg_lists = []
        for name, config in zip(names, configs, strict=True):
            path = Path(folder) / f"{name}.toml"
            path.write_text(config)
            arg_lists.append(["--config", str(path), "--log-level", log_level])
        _serve_over_children(settings, arg_lists, host, port, log_level, "'--upstream'")


def _serve_over_child(
    settings: ProxySettings,
    args: list[str],
    host: str,
    port: int,
    log_level: str,
    option: str = "'--model'",
) -> None:
    """The proxy over one child runtime (``_serve_over_children``)."""
    _serve_over_children(settings, [args], host, port, log_level, option)


def _serve_over_children(
    settings: ProxySettings,
    arg_lists: list[list[str]],
    host: str,
    port: int,
    log_level: str,
    option: str,
) -> None:
    """Start the child runtimes (cli/supervised.py; one after another, each ready before the
    next) with one runtime token (the operator's TALARIA_RUNTIME_TOKEN, else a random one),
    serve the proxy over them, stop them."""
    import contextlib
    import secrets

    from pydantic import SecretStr

    from talaria.cli.supervised import RuntimeStartError, supervised_runtime

    token = settings.runtime_token or SecretStr(secrets.token_urlsafe(32))
    secret = token.get_secret_value()
    try:
        with contextlib.ExitStack() as children:
            urls = [
                children.enter_context(
                    supervised_runtime(args, settings.drain_timeout_s, RUNTIME_READY_S, secret)
                ).url
                for args in arg_lists
            ]
            served = settings.model_copy(update={"runtimes": urls, "runtime_token": token})
            listed = ", ".join(urls)
            console.print(f"talaria proxy on http://{host}:{port}/v1 — runtime {listed}")
            _serve(served, host, port, log_level)
    except RuntimeStartError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from exc


def _refuse_without_keys(settings: ProxySettings) -> None:
    """A non-loopback address with no key ever (store or TALARIA_API_KEYS): refuse to start."""
    from talaria.cli.keys import keys_ever_created

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


def _check_placement(settings: ProxySettings, library: str) -> None:
    """A placement library needs runtime servers and must load."""
    from talaria.proxy.placement.library import load_library

    hint = "'--placement-library'"
    if not settings.runtimes:
        raise typer.BadParameter(
            "placement moves models between runtime servers: give them with --runtime",
            param_hint=hint,
        )
    try:
        load_library(library)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=hint) from exc


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
