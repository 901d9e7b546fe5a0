"""Serving a model by path (runtime/model_source.py, runtime/gguf.py's naming), the start-up
template probe (runtime/engines/tokenizer.py) and what a model served as token ids refuses
(runtime/engines/vllm/generate.py). No vLLM here: these are the pure parts."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
import pytest

from talaria.core.calls import Call, Sampling, ToolChoice, ToolSpec
from talaria.core.catalog import load_catalog
from talaria.core.types import CallRejected
from talaria.runtime import gguf
from talaria.runtime.config import NodeConfigError
from talaria.runtime.engines.tokenizer import TOKENIZER_FILES, HFTokenizer, tool_template_fault
from talaria.runtime.engines.vllm.generate import refuse_what_tokens_cannot_honour
from talaria.runtime.model_source import (
    DEFAULT_WINDOW,
    ServingChoices,
    catalog_match,
    context_window,
    model_config,
    model_directory,
    node_for_models,
    served_name,
    split_spec,
)

CATALOG = load_catalog([])


@pytest.mark.parametrize(
    ("file", "name"),
    [
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-instruct"),
        ("model.F16.gguf", "model"),
        ("Qwen3-8B-IQ4_XS.gguf", "qwen3-8b-iq4_xs"),  # no dot: nothing to strip
        ("llama-3.1-8b.Q8_0.gguf", "llama-3.1-8b"),
        ("plain.gguf", "plain"),
    ],
)
def test_a_gguf_files_served_name_drops_its_quantization(file: str, name: str) -> None:
    assert gguf.model_name(Path(file)) == name


@pytest.mark.parametrize(
    ("spec", "name", "path"),
    [
        ("models/a", None, "models/a"),
        ("smol=models/a", "smol", "models/a"),
        ("=models/a", None, "=models/a"),
    ],
)
def test_a_model_spec_is_a_path_or_name_equals_path(spec: str, name: str | None, path: str) -> None:
    assert split_spec(spec) == (name, Path(path))


@pytest.mark.parametrize(
    ("config", "window"),
    [
        ({"max_position_embeddings": 8192, "seq_length": 4096}, 8192),
        ({"seq_length": 4096}, 4096),
        ({"text_config": {"max_position_embeddings": 32768}}, 32768),
        ({"max_position_embeddings": 0}, DEFAULT_WINDOW),
        ({}, DEFAULT_WINDOW),
    ],
)
def test_the_window_comes_from_the_models_config(config: dict[str, Any], window: int) -> None:
    assert context_window(config) == window


def test_the_catalog_is_matched_by_name_or_repository() -> None:
    spec = next(iter(CATALOG.models.values()))
    repo = spec.hf_id.rpartition("/")[2]
    assert catalog_match(spec.name.upper(), CATALOG) is spec
    assert catalog_match(repo, CATALOG) is spec
    assert catalog_match("no-such-model", CATALOG) is None


def _model_dir(root: Path, name: str, config: dict[str, Any], template: str | None = None) -> Path:
    path = root / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    if template is not None:
        (path / "chat_template.jinja").write_text(template)
    return path


def test_a_directory_is_served_with_its_own_window_and_name(tmp_path: Path) -> None:
    path = _model_dir(tmp_path, "My-Model", {"max_position_embeddings": 4096})
    model = model_config(str(path), ServingChoices(), CATALOG)
    assert (model.name, model.engine, model.path) == ("my-model", "vllm", str(path.resolve()))
    assert model.options == {"max_model_len": 4096}


def test_the_command_lines_choices_win(tmp_path: Path) -> None:
    path = _model_dir(tmp_path, "m", {"max_position_embeddings": 4096})
    choices = ServingChoices("hermes", "qwen3", tmp_path / "t.jinja", 1024)
    model = model_config(f"named={path}", choices, CATALOG)
    assert model.name == "named"
    assert model.options == {
        "max_model_len": 1024,
        "tool_parser": "hermes",
        "reasoning_parser": "qwen3",
        "chat_template": str(tmp_path / "t.jinja"),
    }


def test_a_known_model_gets_the_catalogs_parsers(tmp_path: Path) -> None:
    spec = next(s for s in CATALOG.models.values() if s.tool_parser)
    path = _model_dir(tmp_path, spec.name, {"max_position_embeddings": 4096})
    model = model_config(str(path), ServingChoices(), CATALOG)
    assert model.options.get("tool_parser") == spec.tool_parser
    assert model.options.get("reasoning_parser") == (spec.reasoning_parser or None)


def test_a_converted_gguf_with_the_projects_template_gets_hermes(tmp_path: Path) -> None:
    path = _model_dir(tmp_path, "smol", {}, template=gguf.TOOLS_TEMPLATE.read_text())
    (path / gguf.MARKER).write_text("{}")
    assert model_config(str(path), ServingChoices(), CATALOG).options["tool_parser"] == "hermes"
    (path / "chat_template.jinja").write_text("{{ messages }}")  # the user's own template
    assert "tool_parser" not in model_config(str(path), ServingChoices(), CATALOG).options


@pytest.mark.parametrize(
    ("origin", "refreshed"), [("ours", True), (None, False), ("/their/own.jinja", False)]
)
def test_a_cached_conversion_gets_the_projects_current_template(
    tmp_path: Path, origin: str | None, refreshed: bool
) -> None:
    """A conversion cached before the project's template changed: the template is rewritten
    where the conversion wrote ours (so it is still recognised, and served with ``hermes``),
    never where it wrote the user's or none."""
    source = tmp_path / "smol.gguf"
    source.write_bytes(b"GGUF")
    path = _model_dir(tmp_path, "smol", {}, template="{# an older copy of ours #}")
    (path / gguf.MARKER).write_text(json.dumps({"template": origin}))
    assert gguf.converted_dir(source, out=path) == path
    now = (path / "chat_template.jinja").read_text()
    assert (now == gguf.TOOLS_TEMPLATE.read_text()) is refreshed
    has_parser = "tool_parser" in model_config(str(path), ServingChoices(), CATALOG).options
    assert has_parser is refreshed


@pytest.mark.parametrize(
    ("files", "error"),
    [
        ((), "has no config.json"),
        (("a.gguf", "b.gguf"), "holds 2 .gguf files"),
    ],
)
def test_a_directory_that_is_not_a_model_is_refused_clearly(
    tmp_path: Path, files: Sequence[str], error: str
) -> None:
    for name in files:
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(NodeConfigError, match=error):
        model_directory(tmp_path)
    with pytest.raises(NodeConfigError, match="no model at"):
        model_directory(tmp_path / "missing")


def test_two_models_of_one_name_must_be_named(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    a = _model_dir(tmp_path / "x", "m", {})
    b = _model_dir(tmp_path, "m", {})
    with pytest.raises(NodeConfigError, match="two models named m"):
        node_for_models([str(a), str(b)], ServingChoices(), CATALOG)
    node = node_for_models([str(a), f"m2={b}"], ServingChoices(), CATALOG)
    assert [m.name for m in node.models] == ["m", "m2"]
    assert served_name(tmp_path / "Dir.Name") == "dir.name"


class JinjaTokenizer:
    """What HFTokenizer needs of a ``transformers`` tokenizer, rendering with jinja2 as
    ``apply_chat_template`` does."""

    def __init__(self, template: str) -> None:
        self.template = template

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template: str | None = None,
        tokenize: bool = False,
        add_generation_prompt: bool = True,
    ) -> str:
        env = jinja2.Environment()
        env.filters["tojson"] = lambda v: json.dumps(v)
        source = chat_template or self.template
        return env.from_string(source).render(
            messages=messages, tools=tools, add_generation_prompt=add_generation_prompt
        )


SMOLLM2_OWN = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
)
"""SmolLM2's own template (its GGUF file's): no tools, and ``content: None`` cannot be added."""
NO_TOOLS = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"


@pytest.mark.parametrize(
    ("template", "fault"),
    [
        (SMOLLM2_OWN, "raised TypeError"),
        (NO_TOOLS, "does not render the offered tools"),
        (gguf.TOOLS_TEMPLATE.read_text(), None),
    ],
)
def test_the_probe_refuses_a_template_that_cannot_serve_tools(
    template: str, fault: str | None
) -> None:
    found = tool_template_fault(HFTokenizer(JinjaTokenizer(template)))
    assert (found is None) if fault is None else (found is not None and fault in found), found


def test_the_serving_template_is_the_one_counted() -> None:
    """HFTokenizer renders with the template vLLM serves, not the directory's own."""
    own = JinjaTokenizer(NO_TOOLS)
    served = HFTokenizer(own, gguf.TOOLS_TEMPLATE.read_text())
    text = served.render_chat([{"role": "user", "content": "hi"}])
    assert text.endswith("<|im_start|>assistant\n") and "user: hi" not in text
    assert "tokenizer.json" in TOKENIZER_FILES


def _call(**fields: Any) -> Call:
    return Call(model="tiny", messages=({"role": "user", "content": "hi"},), **fields)


WEATHER = ToolSpec("get_weather", "", {"type": "object"})
SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({}, None),
        ({"tools": (WEATHER,)}, "tools"),
        ({"tools": (WEATHER,), "tool_choice": ToolChoice("named", "get_weather")}, "tools"),
        ({"tools": (WEATHER,), "tool_choice": ToolChoice("none")}, None),
        ({"sampling": Sampling(response_format=SCHEMA)}, "response_format"),
    ],
)
def test_a_model_served_as_token_ids_refuses_what_it_cannot_honour(
    fields: dict[str, Any], param: str | None
) -> None:
    if param is None:
        refuse_what_tokens_cannot_honour(_call(**fields), "tiny")
        return
    with pytest.raises(CallRejected) as refused:
        refuse_what_tokens_cannot_honour(_call(**fields), "tiny")
    assert refused.value.code == "invalid_value" and refused.value.param == param
