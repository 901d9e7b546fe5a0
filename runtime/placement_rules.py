"""What a model placed over the runtime's HTTP API may hold (``POST /v1/runtime/models``,
runtime/placement_routes.py).

The node's own TOML is the operator's and is trusted as it is. An entry that arrives over HTTP
is held to these rules (``placed_model``):

- **Keys**: ``name``, ``engine``, ``path`` and the options its engine lists as placeable
  (``EngineKind.options``, runtime/factory.py); any other key is refused, named.
- **Paths**: ``path`` and every option of kind ``path`` (vLLM's ``chat_template``) must
  resolve, symlinks followed (``Path.resolve``), to something that exists inside the runtime's
  models directory (``talaria runtime --models-dir``, ``TALARIA_RUNTIME_MODELS_DIR``); a
  relative path starts there. With no models directory, an entry with a path is refused. The
  entry goes on with the resolved, absolute paths, so the engine reads what was checked.
- **Code**: an option of kind ``code`` (vLLM's ``trust_remote_code``, which runs Python from
  the model's directory) is refused unless the runtime was started with
  ``--allow-trust-remote-code``; ``false`` is always accepted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from talaria.runtime.config import ModelConfig, NodeConfigError

OptionKind = Literal["value", "path", "code"]
"""How a placeable option is checked: ``value`` as it is, ``path`` inside the models
directory, ``code`` only when the operator allows code from the model's files."""


@dataclass(frozen=True)
class PlacementRules:
    """The operator's rules for models placed over HTTP (``talaria runtime`` options)."""

    models_dir: Path | None = None
    """Where placed models' files must be; None: no placed entry may name a path."""
    allow_trust_remote_code: bool = False
    """Accept options of kind ``code`` (``trust_remote_code = true``)."""


def placed_model(
    model: ModelConfig, options: Mapping[str, OptionKind], rules: PlacementRules
) -> ModelConfig:
    """``model`` (an HTTP-placed ``[[model]]`` entry) checked against ``rules`` and its
    engine's placeable ``options`` (module docstring), its paths resolved; a
    ``NodeConfigError`` says what is refused and how to allow it."""
    where = f"model {model.name!r}"
    unknown = sorted(set(model.options) - set(options))
    if unknown:
        accepted = ", ".join(["name", "engine", "path", *sorted(options)])
        raise NodeConfigError(
            f"{where}: unknown keys {unknown}; a placed {model.engine!r} model may hold {accepted}"
        )
    code = sorted(k for k, v in model.options.items() if options[k] == "code" and v is not False)
    if code and not rules.allow_trust_remote_code:
        raise NodeConfigError(
            f"{where}: {code} would run code from the model's files: refused over HTTP unless "
            "the runtime is started with --allow-trust-remote-code"
        )
    path = None if model.path is None else _inside(model.path, "path", where, rules)
    resolved = {
        k: _inside(v, k, where, rules) if options[k] == "path" else v
        for k, v in model.options.items()
    }
    return ModelConfig(model.name, model.engine, path, resolved)


def _inside(value: Any, key: str, where: str, rules: PlacementRules) -> str:
    """``value`` resolved inside the models directory, or a ``NodeConfigError``."""
    if not isinstance(value, str):
        raise NodeConfigError(f"{where}: {key} must be a string")
    if rules.models_dir is None:
        raise NodeConfigError(
            f"{where}: {key} {value!r} refused: this runtime places no model files over HTTP; "
            "start it with --models-dir DIR (or TALARIA_RUNTIME_MODELS_DIR) to allow files "
            "under DIR"
        )
    root = rules.models_dir.resolve()
    try:
        target = (root / value).resolve()
        exists = target.exists()
    except (OSError, ValueError, RuntimeError) as exc:  # NUL bytes, a symlink loop
        raise NodeConfigError(f"{where}: {key} {value!r}: {exc}") from exc
    if not target.is_relative_to(root):
        raise NodeConfigError(f"{where}: {key} {value!r} is outside the models directory {root}")
    if not exists:
        raise NodeConfigError(f"{where}: {key} {value!r}: nothing there in {root}")
    return str(target)
