"""``talaria runtime``: one node's runtime server (its engines behind the slot scheduler), from a
node config file or from model paths (``--model``)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from talaria.cli.common import CatalogOpt, catalog_of, console, is_loopback
from talaria.core.protocol import MIN_RUNTIME_TOKEN_CHARS, RUNTIME_TOKEN_ENV
from talaria.runtime.scheduling.flags import policy_flags

if TYPE_CHECKING:
    from talaria.core.catalog import Catalog
    from talaria.runtime.config import NodeConfig
    from talaria.runtime.model_source import ServingChoices

ModelOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--model",
        help="Real weights served by vLLM, repeatable: a Hugging Face model directory or a "
        ".gguf file (converted once to a directory in ~/.cache/talaria/models), as PATH or "
        "NAME=PATH (default name: the directory's or file's). Needs vLLM in this environment "
        "(bash scripts/vllm-venv.sh). See docs/models.md.",
    ),
]
ToolParserOpt = Annotated[
    str | None,
    typer.Option(
        help="vLLM tool-call parser of the --model models (e.g. hermes, qwen3_coder); default: "
        "the catalog's for a model it knows, hermes for a GGUF converted with the project's "
        "template, else none (then calls with tools get a 400).",
    ),
]
ReasoningParserOpt = Annotated[
    str | None,
    typer.Option(help="vLLM reasoning parser of the --model models (e.g. qwen3, deepseek_r1)."),
]
ChatTemplateOpt = Annotated[
    Path | None,
    typer.Option(
        help="Chat template (Jinja file) of the --model models; default: the directory's own "
        "(chat_template.jinja or tokenizer_config.json)."
    ),
]
MaxModelLenOpt = Annotated[
    int | None,
    typer.Option(
        min=16,
        help="Context window (prompt + output tokens) of the --model models; default: the "
        "model's own (config.json's max_position_embeddings).",
    ),
]


def runtime_server(
    config: Annotated[
        Path | None,
        typer.Option(help="Node configuration TOML (runtime/config.py); or use --model."),
    ] = None,
    model: ModelOpt = None,
    tool_parser: ToolParserOpt = None,
    reasoning_parser: ReasoningParserOpt = None,
    chat_template: ChatTemplateOpt = None,
    max_model_len: MaxModelLenOpt = None,
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
    models_dir: Annotated[
        Path | None,
        typer.Option(
            envvar="TALARIA_RUNTIME_MODELS_DIR",
            exists=True,
            file_okay=False,
            help="Where models placed over HTTP (POST /v1/runtime/models, a proxy's placement "
            "library) may be read from: their path and chat_template must resolve inside it. "
            "Without it a placed model may not name a file (catalog models need none).",
        ),
    ] = None,
    allow_trust_remote_code: Annotated[
        bool,
        typer.Option(
            "--allow-trust-remote-code",
            help="Let models placed over HTTP set trust_remote_code = true (vLLM then runs "
            "Python from the model's directory); the node config may set it regardless.",
        ),
    ] = False,
    allow_upstream_url: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-upstream-url",
            envvar="TALARIA_RUNTIME_UPSTREAM_URLS",
            help="URL prefix under which models placed over HTTP may name an upstream server "
            "(engine 'openai': it receives every call's prompt), repeatable; the environment "
            "variable holds several, separated by spaces. Matched by scheme, host, port and "
            "whole path segments. Default: none (no upstream is placed over HTTP); the node "
            "config may name any server regardless.",
        ),
    ] = None,
    gpus: Annotated[
        str | None,
        typer.Option(
            help="The GPU group this runtime serves: 1, 2, 4 or 8 of the server's GPUs, as "
            "device ids ('0-3', '4,5'); its vLLM engines get tensor_parallel_size = their "
            "count and see only them (CUDA_VISIBLE_DEVICES). Default: the config's \\[node] "
            "gpus, else CUDA_VISIBLE_DEVICES, else the whole server.",
        ),
    ] = None,
) -> None:
    """Run one node's runtime server: its engines (simulated or vLLM) behind the slot scheduler,
    serving the proxy over HTTP (talaria serve --runtime http://HOST:PORT). The node comes
    from --config FILE, or from one or more --model PATH (vLLM engines, everything else from
    the model itself). Every request but /healthz and /readyz needs the bearer token
    TALARIA_RUNTIME_TOKEN when it is set (the proxy sends the one in its own environment); a
    non-loopback --host without it is refused. SIGTERM drains: no new connections, in-flight
    calls finish, then the engines shut down."""
    from talaria.runtime.model_source import ServingChoices
    from talaria.runtime.placement_rules import PlacementRules
    from talaria.runtime.serve import serve_runtime
    from talaria.runtime.server import create_runtime_app

    token = runtime_token(host)
    catalog = catalog_of(catalog_dirs)
    choices = ServingChoices(tool_parser, reasoning_parser, chat_template, max_model_len)
    node = on_group(node_config(config, model, choices, catalog), gpus, catalog)
    console.print(
        f"talaria runtime {node.name} on http://{host}:{port} — "
        + ", ".join(f"{m.name} ({m.engine})" for m in node.models)
        + ("" if token else f"; open to any caller (no {RUNTIME_TOKEN_ENV})")
    )
    rules = PlacementRules(
        models_dir, allow_trust_remote_code, upstream_prefixes(allow_upstream_url)
    )
    app_ = create_runtime_app(node, [str(p) for p in catalog_dirs or []], token=token, rules=rules)
    serve_runtime(app_, host, port, log_level, drain_timeout_s)


def upstream_prefixes(given: list[str] | None) -> tuple[str, ...]:
    """The ``--allow-upstream-url`` prefixes, each checked (runtime/placement_rules.py
    ``url_parts``): one that is not a plain ``http[s]`` URL is refused in one line."""
    from talaria.runtime.placement_rules import url_parts

    prefixes = tuple(p.strip() for p in given or () if p.strip())
    for prefix in prefixes:
        if url_parts(prefix) is None:
            raise typer.BadParameter(
                f"{prefix!r} is not an http(s) URL prefix (scheme, host, optional port and "
                "path; no user info, query or fragment)",
                param_hint="'--allow-upstream-url'",
            )
    return prefixes


def runtime_token(host: str) -> str | None:
    """``TALARIA_RUNTIME_TOKEN`` (surrounding blanks dropped), or None on a loopback ``host``;
    on any other address a runtime without one is refused in one line that says how to set
    it, and so is a token under ``MIN_RUNTIME_TOKEN_CHARS``."""
    token = os.environ.get(RUNTIME_TOKEN_ENV, "").strip() or None
    if token is None and not is_loopback(host):
        raise typer.BadParameter(
            f"no {RUNTIME_TOKEN_ENV}: on a non-loopback address anyone who reaches the port "
            "could place models, end sessions and run calls; set "
            f"{RUNTIME_TOKEN_ENV} (at least {MIN_RUNTIME_TOKEN_CHARS} characters, e.g. "
            "python -c 'import secrets; print(secrets.token_urlsafe(32))') here and the same "
            "value in the proxy's environment",
            param_hint="'--host'",
        )
    if token is not None and len(token) < MIN_RUNTIME_TOKEN_CHARS:
        raise typer.BadParameter(
            f"{RUNTIME_TOKEN_ENV} must be at least {MIN_RUNTIME_TOKEN_CHARS} characters "
            f"(it has {len(token)})"
        )
    return token


def node_config(
    config: Path | None, models: list[str] | None, choices: ServingChoices, catalog: Catalog
) -> NodeConfig:
    """The node of ``--config`` or of the ``--model`` paths (exactly one of them), checked:
    its policy parses, and each vLLM model with a tool parser has a chat template that renders
    tool calls and their results (else one clear line, not a failure at the first call)."""
    from talaria.runtime.config import NodeConfigError, load_node_config
    from talaria.runtime.model_source import node_for_models, serving_faults

    if (config is None) == (not models):
        raise typer.BadParameter("give --config FILE or one or more --model PATH (not both)")
    try:
        if config is not None:
            node = load_node_config(config)
        else:
            require_vllm()
            os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local path needs no hub
            node = node_for_models(list(models or ()), choices, catalog)
        policy_flags(node.policy)
        faults = serving_faults(node)
    except (NodeConfigError, ValueError, RuntimeError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    if faults:
        raise typer.BadParameter("; ".join(faults))
    return node


def on_group(node: NodeConfig, flag: str | None, catalog: Catalog) -> NodeConfig:
    """The node on its GPU group (``--gpus``, else its config's, else ``CUDA_VISIBLE_DEVICES``:
    its count when it names devices by UUID), checked at once: a group that is not 1, 2, 4 or
    8 of the server's GPUs, or a simulated model that does not fit it, is one line naming the
    numbers. A group given by the flag or the config becomes this process's
    ``CUDA_VISIBLE_DEVICES`` (vLLM's engines see only its GPUs)."""
    from talaria.core.groups import GroupError, check_fits
    from talaria.runtime.config import NodeConfigError, parse_gpus

    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    try:
        if flag is not None:
            node = replace(node, gpus=parse_gpus(flag, "--gpus"))
        elif node.gpus is None and visible:
            entries = visible.split(",")
            numeric = all(e.strip().isdigit() for e in entries)
            ids = parse_gpus(visible, "CUDA_VISIBLE_DEVICES") if numeric else range(len(entries))
            node = replace(node, gpus=tuple(ids))
        server = node.server_spec(catalog)
        for model in node.models:
            if node.gpus is not None and model.engine == "sim":
                check_fits(catalog.model(model.name), catalog.server(node.server), server.gpus)
    except (NodeConfigError, GroupError) as exc:
        raise typer.BadParameter(str(exc), param_hint="'--gpus'") from exc
    if node.gpus is not None and (flag is not None or not visible):
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in node.gpus)
    return node


def require_vllm() -> None:
    """vLLM must be importable here to serve real weights; else one line that says how."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise typer.BadParameter(
            "serving a model needs vLLM in this Python environment: run "
            "'bash scripts/vllm-venv.sh', then use .venv-vllm/bin/talaria",
            param_hint="'--model'",
        )
