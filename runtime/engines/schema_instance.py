"""A small, harmless instance of a JSON schema: the arguments the simulated engine writes for a
tool call, and its JSON when a caller asks for structured output.

Covers what agents' tool schemas use (checked against the schemas Claude Code, Codex and Qwen
Code send, tests/fixtures/agent_tools/): ``type`` (one or a list), ``properties`` /
``required`` (only required properties are filled), ``enum``, ``const``, ``default``,
``anyOf`` / ``oneOf`` (the first that is not ``null``), ``allOf`` (object parts merged), local
``$ref`` (``#/$defs/…``, ``#/definitions/…``), ``minLength`` / ``maxLength``, ``minimum`` /
``maximum`` (exclusive too), ``minItems``, ``prefixItems``. String values follow the property's
name so that a call reads as a harmless action: a command is ``ls``, a path is ``.`` or
``README.md``, a pattern is ``*``. ``pattern`` and ``format`` constraints are not honoured.
Written here rather than taken from a library: the schema-driven generators on PyPI
(hypothesis-jsonschema and the like) draw random values, and a simulated agent step must be
deterministic and harmless.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

MAX_DEPTH = 8
"""Nested schemas deeper than this get ``None`` (a recursive ``$ref`` would never end)."""

_COMMAND_NAMES = frozenset({"command", "cmd", "commands", "script", "shell_command"})
_PATTERN_NAMES = frozenset({"pattern", "glob", "glob_pattern", "include", "filter"})
_QUERY_NAMES = frozenset({"query", "q", "regex", "search", "text", "keyword", "keywords"})
_DIR_NAMES = frozenset({"path", "dir", "directory", "dir_path", "cwd", "workdir", "root", "folder"})


def name_words(name: str) -> set[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return {w for w in re.split(r"[^a-zA-Z0-9]+", spaced.lower()) if w}


def string_for(name: str, description: str = "") -> str:
    """A harmless value for a string property called ``name``."""
    key = name.lower()
    absolute = "absolute" in description.lower()
    if key in _COMMAND_NAMES:
        return "ls"
    if key in _PATTERN_NAMES:
        return "*"
    if key in _QUERY_NAMES:
        return "TODO"
    if key in _DIR_NAMES:
        return "/" if absolute else "."
    words = name_words(name)
    if "file" in words or "path" in words:
        return "/etc/hostname" if absolute else "README.md"
    if "url" in words:
        return "http://127.0.0.1/"
    return "simulated"


def _resolve(schema: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = schema.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return schema
    node: Any = root
    for part in ref[2:].split("/"):
        if not isinstance(node, Mapping) or part not in node:
            return {}
        node = node[part]
    return node if isinstance(node, Mapping) else {}


def instance(
    schema: Any,
    name: str = "",
    description: str = "",
    root: Mapping[str, Any] | None = None,
    depth: int = 0,
) -> Any:
    """A value valid against ``schema`` (see the module docstring for what is covered)."""
    if not isinstance(schema, Mapping) or depth > MAX_DEPTH:
        return None
    root = schema if root is None else root
    schema = _resolve(schema, root)
    description = str(schema.get("description", description))
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    if "default" in schema and schema["default"] is not None:
        return schema["default"]
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            chosen = next(
                (o for o in options if isinstance(o, Mapping) and o.get("type") != "null"),
                options[0],
            )
            return instance(chosen, name, description, root, depth + 1)
    if isinstance(schema.get("allOf"), list):
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            value = instance(part, name, description, root, depth + 1)
            if isinstance(value, dict):
                merged.update(value)
        if merged or not schema.get("type"):
            return merged
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    if kind == "object":
        return _object(schema, root, depth)
    if kind == "array":
        return _array(schema, name, description, root, depth)
    if kind == "string":
        return _string(schema, name, description)
    if kind in ("integer", "number"):
        return _number(schema, kind)
    if kind == "boolean":
        return False
    return None


def _object(schema: Mapping[str, Any], root: Mapping[str, Any], depth: int) -> dict[str, Any]:
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    required = schema.get("required")
    out: dict[str, Any] = {}
    for key in required if isinstance(required, list) else []:
        sub = properties.get(key, {})
        out[key] = instance(sub, key, "", root, depth + 1)
    return out


def _array(
    schema: Mapping[str, Any], name: str, description: str, root: Mapping[str, Any], depth: int
) -> list[Any]:
    prefix = schema.get("prefixItems")
    if isinstance(prefix, list) and prefix:
        return [instance(p, name, description, root, depth + 1) for p in prefix]
    items = schema.get("items", {})
    minimum = schema.get("minItems")
    count = minimum if isinstance(minimum, int) and minimum > 0 else 0
    if name.lower() in _COMMAND_NAMES:
        count = max(count, 1)  # ["ls"]: a command as an argv list
    return [instance(items, name, description, root, depth + 1) for _ in range(count)]


def _string(schema: Mapping[str, Any], name: str, description: str) -> str:
    value = string_for(name, description)
    low, high = schema.get("minLength"), schema.get("maxLength")
    if isinstance(high, int) and len(value) > high:
        value = value[:high]
    if isinstance(low, int) and len(value) < low:
        value = value + "x" * (low - len(value))
    return value


def _number(schema: Mapping[str, Any], kind: str) -> int | float:
    low = schema.get("minimum")
    high = schema.get("maximum")
    ex_low = schema.get("exclusiveMinimum")
    ex_high = schema.get("exclusiveMaximum")
    value: float = 1
    if isinstance(low, int | float):
        value = max(value, low)
    if isinstance(ex_low, int | float) and not isinstance(ex_low, bool):
        value = max(value, ex_low + 1)
    if isinstance(high, int | float):
        value = min(value, high)
    if isinstance(ex_high, int | float) and not isinstance(ex_high, bool):
        value = min(value, ex_high - 1)
    return int(value) if kind == "integer" else value
