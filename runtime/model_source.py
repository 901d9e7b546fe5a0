"""A model given by path (``talaria runtime --model PATH``, ``talaria serve --model PATH``): the
node config that serves it on vLLM, with what a node TOML would otherwise say taken from the
model itself.

- ``PATH`` is a Hugging Face model directory, a ``.gguf`` file, or a directory holding one
  ``.gguf`` file and no ``config.json``; a GGUF file is converted once to a directory
  (runtime/gguf.py). ``NAME=PATH`` names the served model; else the name is the directory's
  (or the GGUF file's stem, without its quantization suffix), lower case.
- The context window is the model's own (``config.json``'s ``max_position_embeddings``, or
  the first of ``MAX_LENGTH_KEYS`` it has), unless ``max_model_len`` says otherwise.
- The tool-call and reasoning parsers are the catalog's when the catalog knows the model (its
  name, or its ``hf_id``'s repository name, equals the served name, case aside); a directory
  converted from GGUF with the project's template gets ``hermes``, the format that template
  writes; ``tool_parser`` / ``reasoning_parser`` override both.
- The chat template is ``chat_template`` (a file) or the directory's own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from talaria.core.catalog import Catalog
from talaria.core.model_spec import ModelSpec
from talaria.runtime.config import ModelConfig, NodeConfig, NodeConfigError

MAX_LENGTH_KEYS = ("max_position_embeddings", "max_seq_len", "n_positions", "seq_length")
"""``config.json`` keys of a model's context window, in the order they are looked for."""
DEFAULT_WINDOW = 2048
"""The window of a model whose config names none of ``MAX_LENGTH_KEYS``."""


@dataclass(frozen=True)
class ServingChoices:
    """What the command line says about every ``--model`` (None: the model's own default)."""

    tool_parser: str | None = None
    reasoning_parser: str | None = None
    chat_template: Path | None = None
    max_model_len: int | None = None


def split_spec(spec: str) -> tuple[str | None, Path]:
    """``NAME=PATH`` → (NAME, PATH); ``PATH`` → (None, PATH). A ``=`` inside a path that exists
    is part of the path."""
    name, eq, rest = spec.partition("=")
    if eq and name and not Path(spec).exists():
        return name, Path(rest).expanduser()
    return None, Path(spec).expanduser()


def model_directory(path: Path) -> Path:
    """The Hugging Face directory of ``path`` (see the module docstring); a GGUF file is
    converted on first use. ``NodeConfigError`` when ``path`` is neither."""
    from talaria.runtime import gguf

    if path.is_file() and path.name.endswith(".gguf"):
        return gguf.converted_dir(path)
    if path.is_dir():
        if (path / "config.json").is_file():
            return path
        files = sorted(path.glob("*.gguf"))
        if len(files) == 1:
            return gguf.converted_dir(files[0])
        if files:
            raise NodeConfigError(
                f"{path} holds {len(files)} .gguf files: name one (--model {files[0]})"
            )
        raise NodeConfigError(f"{path} is not a model directory: it has no config.json")
    raise NodeConfigError(f"no model at {path}: give a model directory or a .gguf file")


def served_name(path: Path) -> str:
    """The default served name of ``path``: the GGUF file's (runtime/gguf.py) or the
    directory's name, lower case."""
    from talaria.runtime import gguf

    if path.name.endswith(".gguf"):
        return gguf.model_name(path)
    return path.resolve().name.lower()


def context_window(config: dict[str, Any]) -> int:
    """The first of ``MAX_LENGTH_KEYS`` in a model's ``config.json`` (its ``text_config`` for a
    multimodal one), else ``DEFAULT_WINDOW``."""
    for doc in (config, config.get("text_config") or {}):
        for key in MAX_LENGTH_KEYS:
            value = doc.get(key)
            if isinstance(value, int) and value > 0:
                return value
    return DEFAULT_WINDOW


def catalog_match(name: str, catalog: Catalog) -> ModelSpec | None:
    """The catalog model whose name, or whose ``hf_id``'s repository name, is ``name`` (case
    aside)."""
    want = name.lower()
    for spec in catalog.models.values():
        repo = (spec.hf_id or "").rpartition("/")[2].lower()
        if want in (spec.name.lower(), repo):
            return spec
    return None


def _converted_with_our_template(directory: Path) -> bool:
    from talaria.runtime import gguf

    own = directory / "chat_template.jinja"
    return (
        (directory / gguf.MARKER).is_file()
        and own.is_file()
        and own.read_text() == gguf.TOOLS_TEMPLATE.read_text()
    )


def model_config(spec: str, choices: ServingChoices, catalog: Catalog) -> ModelConfig:
    """The ``[[model]]`` entry that serves ``spec`` (``PATH`` or ``NAME=PATH``) on vLLM."""
    given, path = split_spec(spec)
    directory = model_directory(path)
    name = given or served_name(path)
    config = json.loads((directory / "config.json").read_text())
    options: dict[str, Any] = {"max_model_len": choices.max_model_len or context_window(config)}
    known = catalog_match(name, catalog)
    tool_parser = known.tool_parser if known is not None else None
    if tool_parser is None and _converted_with_our_template(directory):
        tool_parser = "hermes"
    reasoning_parser = known.reasoning_parser if known is not None else None
    picked = {
        "tool_parser": choices.tool_parser or tool_parser,
        "reasoning_parser": choices.reasoning_parser or reasoning_parser,
        "chat_template": str(choices.chat_template) if choices.chat_template else None,
    }
    options.update({k: v for k, v in picked.items() if v})
    return ModelConfig(name, "vllm", str(directory.resolve()), options)


def node_for_models(
    specs: list[str], choices: ServingChoices, catalog: Catalog, name: str = "node0"
) -> NodeConfig:
    """A node serving each of ``specs`` on vLLM (in order), with the default policy."""
    models = tuple(model_config(spec, choices, catalog) for spec in specs)
    names = [m.name for m in models]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise NodeConfigError(f"two models named {', '.join(twice)}: name them (NAME=PATH)")
    return NodeConfig(name=name, models=models)


def serving_faults(node: NodeConfig) -> list[str]:
    """One line per vLLM model of ``node`` that has a tool-call parser but a chat template
    that cannot render tools, a tool call with ``content: None`` and its result (the probe of
    runtime/engines/tokenizer.py, rendered with the template vLLM will serve). Checked at start, so
    that such a node fails at once instead of at an agent's first tool call."""
    from talaria.runtime.engines.tokenizer import HFTokenizer, load_tokenizer, tool_template_fault

    faults = []
    for model in node.models:
        tool_parser = model.options.get("tool_parser")
        if model.engine != "vllm" or not tool_parser:
            continue
        template = model.options.get("chat_template")
        tokenizer = load_tokenizer(node.model_dir(model), template)
        if not isinstance(tokenizer, HFTokenizer):
            continue
        fault = tool_template_fault(tokenizer)
        if fault is not None:
            faults.append(
                f"model {model.name}: its chat template cannot serve the {tool_parser!r} "
                f"tool parser: {fault}. Pass --chat-template FILE (or a chat_template option); "
                "runtime/templates/chatml-tools.jinja writes the hermes format"
            )
    return faults
