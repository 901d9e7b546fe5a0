"""What a model placed over the runtime's HTTP API may hold (``POST /v1/runtime/models``,
runtime/placement_routes.py).

The node's own TOML is the operator's and is trusted as it is. An entry that arrives over HTTP
is held to these rules (``placed_model``):

- **Keys**: ``name``, ``engine``, ``path`` and the options its engine lists as placeable
  (``VLLM_PLACEABLE``, ``UPSTREAM_PLACEABLE``: ``EngineKind.options``, runtime/engine_kinds.py);
  any other key is refused, named.
- **Paths**: ``path`` and every option of kind ``path`` (vLLM's ``chat_template``) must
  resolve, symlinks followed (``Path.resolve``), to something that exists inside the runtime's
  models directory (``talaria runtime --models-dir``, ``TALARIA_RUNTIME_MODELS_DIR``); a
  relative path starts there. With no models directory, an entry with a path is refused. The
  entry goes on with the resolved, absolute paths, so the engine reads what was checked.
- **Code**: an option of kind ``code`` (vLLM's ``trust_remote_code``, which runs Python from
  the model's directory) is refused unless the runtime was started with
  ``--allow-trust-remote-code``; ``false`` is always accepted.
- **Servers**: an option of kind ``url`` (an ``openai`` model's server, which receives every
  call's prompt and whose answers the node reads) must start with one of the URL prefixes
  the operator allows (``--allow-upstream-url PREFIX``, ``TALARIA_RUNTIME_UPSTREAM_URLS``);
  none by default, so no upstream is placed over HTTP unless the operator says where.
  A prefix matches by parts (``url_allowed``): the same scheme, host and port, and the
  URL's path segments starting with the prefix's, so ``http://gpu1:8000`` allows
  ``http://gpu1:8000/v1`` but not ``http://gpu1:80001`` nor ``http://gpu1:8000.evil.net``.
  A URL with user info, a query, a fragment, ``.``/``..`` segments, an empty segment or a
  ``%`` or ``\\`` in its path is refused whatever the prefixes.
- **Names** (``check_served``): a placed model named as a catalog model must serve that
  model: its option of kind ``served`` (an upstream's ``served_model``, by default the
  name) must be the catalog model's name or its ``hf_id``. Else a placer could make a name
  every tenant calls reach another model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from talaria.core.catalog import Catalog
from talaria.runtime.config import ModelConfig, NodeConfigError

OptionKind = Literal["value", "path", "code", "url", "served"]
"""How a placeable option is checked: ``value`` as it is, ``path`` inside the models
directory, ``code`` only when the operator allows code from the model's files, ``url`` only
under a URL prefix the operator allows, ``served`` (the model a server serves under the
name) as a value that ``check_served`` holds to the catalog."""


VLLM_PLACEABLE: dict[str, OptionKind] = {
    **dict.fromkeys(
        ("max_model_len", "tensor_parallel_size", "gpu_memory_utilization", "dtype",
         "kv_offloading_size", "kv_offloading_backend", "tool_parser", "reasoning_parser",
         "tool_strict_level", "sleep_level", "rates"),
        "value",
    ),
    "chat_template": "path",
    "trust_remote_code": "code",
}  # fmt: skip
"""The options of a vLLM model placed over HTTP: those docs/models.md and docs/deploy-h200.md
document (any other engine argument only in the node's own TOML)."""

UPSTREAM_PLACEABLE: dict[str, OptionKind] = {
    **dict.fromkeys(
        ("sleep", "context_window", "weight_bytes", "device_bytes", "staging", "rates",
         "timeout_s"),
        "value",
    ),
    "url": "url",
    "served_model": "served",
}  # fmt: skip
"""The options of an upstream model placed over HTTP: its ``url`` only under a prefix the
operator allows, its ``served_model`` the catalog's model when it takes a catalog name
(``check_served``). Not ``api_key_env`` (a placed model must not choose which of
the runtime's environment variables is sent to its URL), nor ``cache_isolation`` (how
tenants' prefixes are kept apart is the operator's choice) nor the read bounds beyond
``timeout_s`` (runtime/engines/upstream/options.py ``BOUNDS``: what protects the node's memory
and time is the operator's too); a placed model gets their defaults."""


@dataclass(frozen=True)
class PlacementRules:
    """The operator's rules for models placed over HTTP (``talaria runtime`` options)."""

    models_dir: Path | None = None
    """Where placed models' files must be; None: no placed entry may name a path."""
    allow_trust_remote_code: bool = False
    """Accept options of kind ``code`` (``trust_remote_code = true``)."""
    upstream_urls: tuple[str, ...] = ()
    """URL prefixes an option of kind ``url`` may start with (``url_allowed``); empty: none."""


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
    for key in sorted(k for k in model.options if options[k] == "url"):
        _allowed(model.options[key], key, where, rules)
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


def _allowed(value: Any, key: str, where: str, rules: PlacementRules) -> None:
    """``value`` under one of the operator's URL prefixes, or a ``NodeConfigError``."""
    if not rules.upstream_urls:
        raise NodeConfigError(
            f"{where}: {key} refused: this runtime places no upstream server over HTTP; "
            "start it with --allow-upstream-url PREFIX (or TALARIA_RUNTIME_UPSTREAM_URLS) to "
            "allow servers under PREFIX"
        )
    if not isinstance(value, str) or not url_allowed(value, rules.upstream_urls):
        shown = repr(value)[:200]
        raise NodeConfigError(
            f"{where}: {key} {shown} is not under an allowed upstream URL prefix "
            f"({', '.join(rules.upstream_urls)})"
        )


UrlParts = tuple[str, str, int, tuple[str, ...]]
"""A URL as ``url_allowed`` compares it: scheme, host, port, path segments."""
DEFAULT_PORTS = {"http": 80, "https": 443}


def url_parts(url: str) -> UrlParts | None:
    """``url``'s scheme, host (lower case), port (the scheme's default if none) and path
    segments (a trailing ``/`` dropped); None for a URL that is not plain ``http[s]`` to a
    host (user info, query, fragment, a ``.``/``..`` or empty segment, ``%`` or ``\\`` in
    the path, whitespace or control characters anywhere)."""
    if any(c.isspace() or not c.isprintable() for c in url):
        return None
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname or parts.username is not None:
        return None
    if parts.password is not None or parts.query or parts.fragment or "?" in url or "#" in url:
        return None
    path = parts.path.removesuffix("/")
    if "%" in path or "\\" in path or "@" in parts.netloc:
        return None
    segments = tuple(path.split("/")[1:]) if path else ()
    if any(s in ("", ".", "..") for s in segments):
        return None
    return scheme, parts.hostname.lower(), port or DEFAULT_PORTS[scheme], segments


def url_allowed(url: str, prefixes: Sequence[str]) -> bool:
    """Whether ``url`` is under one of ``prefixes``: the same scheme, host and port, and its
    path segments begin with the prefix's (``url_parts``; a malformed URL never is)."""
    target = url_parts(url)
    if target is None:
        return False
    for prefix in prefixes:
        allowed = url_parts(prefix)
        if allowed is None:
            continue
        scheme, host, port, segments = allowed
        if target[:3] == (scheme, host, port) and target[3][: len(segments)] == segments:
            return True
    return False


def check_served(model: ModelConfig, options: Mapping[str, OptionKind], catalog: Catalog) -> None:
    """A placed ``model`` named as a catalog model serves that model (module docstring:
    "Names"), else a ``NodeConfigError`` naming both."""
    spec = catalog.find(model.name)
    if spec is None:
        return
    for key in sorted(k for k, kind in options.items() if kind == "served"):
        served = model.options.get(key, model.name)
        if served not in (spec.name, spec.hf_id):
            raise NodeConfigError(
                f"model {model.name!r}: {key} {str(served)[:200]!r} would serve another model "
                f"under the catalog's name {model.name!r}; a placed model of that name must "
                f"serve it ({spec.name!r} or {spec.hf_id!r}), or take a name of its own"
            )
