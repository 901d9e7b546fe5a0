"""``talaria runtime``: one node's runtime server (its engines behind the slot scheduler)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from talaria.cli.common import CatalogOpt, console
from talaria.runtime.scheduling.flags import policy_flags


def runtime_server(
    config: Annotated[Path, typer.Option(help="Node configuration TOML (runtime/config.py).")],
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 9000,
    catalog_dirs: CatalogOpt = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    drain_timeout_s: Annotated[
        float,
        typer.Option(
            min=0.1,
            help="On SIGTERM, how long calls in flight get to finish; the process ends "
            "within this plus 30 s (engine shutdown) whatever happens.",
        ),
    ] = 600.0,
) -> None:
    """Run one node's runtime server: its engines (simulated or vLLM) behind the slot scheduler,
    serving the proxy over HTTP (talaria serve --runtime http://HOST:PORT). SIGTERM drains:
    no new connections, in-flight calls finish, then the engines shut down."""
    from talaria.runtime.config import NodeConfigError, load_node_config
    from talaria.runtime.server import create_runtime_app, serve_runtime

    try:
        node = load_node_config(config)
        policy_flags(node.policy)
    except (NodeConfigError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    console.print(
        f"talaria runtime {node.name} on http://{host}:{port} — "
        + ", ".join(f"{m.name} ({m.engine})" for m in node.models)
    )
    app_ = create_runtime_app(node, [str(p) for p in catalog_dirs or []])
    serve_runtime(app_, host, port, log_level, drain_timeout_s)
