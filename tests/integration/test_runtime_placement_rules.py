"""What a model placed over the runtime's HTTP API may hold (runtime/placement_rules.py),
through the real HTTP stack: only its engine's documented options, paths inside the runtime's
models directory (symlinks followed), no ``trust_remote_code`` unless the operator allows it;
catalog models that name no file are placed as before."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from talaria.runtime.config import ModelConfig, load_node_config
from talaria.runtime.engine import Engine
from talaria.runtime.engine_kinds import ENGINES, EngineKind, EngineSite
from talaria.runtime.placement_rules import VLLM_PLACEABLE, PlacementRules
from talaria.runtime.server import create_runtime_app
from tests.integration.server import running_app

NODE_TOML = """
[node]
name = "rt-rules"
quantum_s = 30
time_scale = 500

[[model]]
name = "glm-4.5-fp8"
engine = "sim"
"""


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[ModelConfig]:
    """An engine kind ``filed`` with vLLM's placeable options whose build records the entry
    it gets (then builds a simulated engine): what the node would load."""
    seen: list[ModelConfig] = []

    def build(site: EngineSite) -> Engine:
        seen.append(site.model)
        return ENGINES["sim"].build(site)

    monkeypatch.setitem(
        ENGINES, "filed", EngineKind(build, uses_node_memory=True, options=VLLM_PLACEABLE)
    )
    return seen


@contextmanager
def _runtime(tmp_path: Path, rules: PlacementRules | None = None) -> Iterator[str]:
    node = tmp_path / "node.toml"
    node.write_text(NODE_TOML)
    with running_app(create_runtime_app(load_node_config(node), rules=rules)) as url:
        yield url + "/v1/runtime/models"


def _models_dir(tmp_path: Path) -> Path:
    models = tmp_path / "models"
    (models / "tiny").mkdir(parents=True)
    (models / "tiny" / "config.json").write_text("{}")
    (models / "tiny" / "chat.jinja").write_text("{{ messages }}")
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "key.jinja").write_text("not yours")
    (models / "escape").symlink_to(tmp_path / "secret")
    return models


def _refused(models: str, entry: dict[str, object], *words: str) -> None:
    answer = httpx.post(models, json=entry)
    assert answer.status_code == 400, (entry, answer.text)
    error = answer.json()["error"]
    for word in words:
        assert word in error, (entry, error)


def test_without_a_models_dir_no_placed_model_names_a_file(
    tmp_path: Path, built: list[ModelConfig]
) -> None:
    models_dir = _models_dir(tmp_path)
    with _runtime(tmp_path) as models:
        for entry in (
            {"name": "gpt-oss-120b", "engine": "filed", "path": str(models_dir / "tiny")},
            {"name": "gpt-oss-120b", "engine": "vllm", "path": "/etc"},
            {"name": "gpt-oss-120b", "engine": "sim", "path": "anything"},
        ):
            _refused(models, entry, "--models-dir", "TALARIA_RUNTIME_MODELS_DIR")
        chat = {"name": "gpt-oss-120b", "engine": "filed", "chat_template": "/etc/passwd"}
        _refused(models, chat, "chat_template", "--models-dir")
        # a catalog model names no file: placed as before
        added = httpx.post(models, json={"name": "gpt-oss-120b", "engine": "sim"})
        assert added.status_code == 201, added.text
    assert built == []


def test_paths_must_resolve_inside_the_models_dir(tmp_path: Path, built: list[ModelConfig]) -> None:
    models_dir = _models_dir(tmp_path)
    with _runtime(tmp_path, PlacementRules(models_dir)) as models:
        outside = [
            "/etc",
            str(tmp_path / "secret"),
            "../secret",
            "tiny/../../secret",
            "escape",  # a symlink inside that leads outside
        ]
        for path in outside:
            entry = {"name": "gpt-oss-120b", "engine": "filed", "path": path}
            _refused(models, entry, "outside the models directory")
        for template in ("escape/key.jinja", str(tmp_path / "secret" / "key.jinja")):
            entry = {"name": "gpt-oss-120b", "engine": "filed", "path": "tiny"}
            _refused(models, entry | {"chat_template": template}, "chat_template", "outside")
        _refused(models, {"name": "x", "engine": "filed", "path": "absent"}, "nothing there")
        _refused(models, {"name": "x", "engine": "filed", "path": "a\u0000b"}, "path")
        assert built == []
        entry = {
            "name": "gpt-oss-120b",
            "engine": "filed",
            "path": "tiny",
            "chat_template": str(models_dir / "tiny" / "chat.jinja"),
            "max_model_len": 2048,
        }
        added = httpx.post(models, json=entry)
        assert added.status_code == 201, added.text
    root = models_dir.resolve()
    assert built == [
        ModelConfig(
            "gpt-oss-120b",
            "filed",
            str(root / "tiny"),  # the engine loads what was checked: resolved, absolute
            {"chat_template": str(root / "tiny" / "chat.jinja"), "max_model_len": 2048},
        )
    ]


def test_unknown_keys_are_refused_by_name(tmp_path: Path, built: list[ModelConfig]) -> None:
    models_dir = _models_dir(tmp_path)
    with _runtime(tmp_path, PlacementRules(models_dir)) as models:
        vllm = {"name": "tiny", "engine": "vllm", "path": "tiny"}
        for key, value in (
            ("worker_extension_cls", "evil.Extension"),  # a class vLLM would import
            ("download_dir", "/tmp"),
            ("enforce_eager", True),  # harmless, but not documented for a placed model
        ):
            _refused(models, vllm | {key: value}, f"unknown keys ['{key}']", "max_model_len")
        # the simulated engine reads no option at all
        sim = {"name": "gpt-oss-120b", "engine": "sim", "weight_bytes": 1, "rates": {}}
        _refused(models, sim, "unknown keys ['rates', 'weight_bytes']")
    assert built == []


def test_trust_remote_code_only_when_the_operator_allows_it(
    tmp_path: Path, built: list[ModelConfig]
) -> None:
    models_dir = _models_dir(tmp_path)
    entry = {"name": "gpt-oss-120b", "engine": "filed", "path": "tiny"}
    trusted = entry | {"trust_remote_code": True}
    with _runtime(tmp_path, PlacementRules(models_dir)) as models:
        _refused(models, trusted, "trust_remote_code", "--allow-trust-remote-code")
        _refused(models, {**trusted, "engine": "vllm"}, "--allow-trust-remote-code")
        _refused(models, entry | {"trust_remote_code": "yes"}, "--allow-trust-remote-code")
        assert built == []
        # false is no risk
        refused_not = httpx.post(models, json=entry | {"trust_remote_code": False})
        assert refused_not.status_code == 201, refused_not.text
    with _runtime(tmp_path, PlacementRules(models_dir, allow_trust_remote_code=True)) as models:
        allowed = httpx.post(models, json=trusted)
        assert allowed.status_code == 201, allowed.text
    assert [m.options for m in built] == [{"trust_remote_code": False}, {"trust_remote_code": True}]
