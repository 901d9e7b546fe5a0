"""A small, harmless instance of a JSON schema: the arguments the simulated engine writes for a
tool call, and its JSON when a caller asks for structured output; and, with the same builder,
the bound on the work a schema in a request may demand (:func:`check_schemas`).

Covers what agents' tool schemas use (checked against the schemas Claude Code, Codex and Qwen
Code send, bench/fixtures/agent_tools/): ``type`` (one or a list), ``properties`` /
``required`` (only required properties are filled), ``enum``, ``const``, ``default``,
``anyOf`` / ``oneOf`` (the first that is not ``null``), ``allOf`` (object parts merged), local
``$ref`` (``#/$defs/…``, ``#/definitions/…``), ``minLength`` / ``maxLength``, ``minimum`` /
``maximum`` (exclusive too), ``minItems``, ``prefixItems``. String values follow the property's
name so that a call reads as a harmless action: a command is ``ls``, a path is ``.`` or
``README.md``, a pattern is ``*``. ``pattern`` and ``format`` constraints are not honoured.
Written here rather than taken from a library: the schema-driven generators on PyPI
(hypothesis-jsonschema and the like) draw random values, and a simulated agent step must be
deterministic and harmless.

**Bounded work.** A schema is the client's input, and its instance can be far larger than the
schema: ``{"minItems": 1000000000}``, nested ``minItems``, or a ``$ref`` that requires itself
twice (2^depth values). Every build runs against an :class:`InstanceBudget` of
``MAX_INSTANCE_VALUES`` values and ``MAX_INSTANCE_CHARS`` characters, checked *before* a
count is expanded, so a build costs O(budget) whatever the schema asks: past the budget it
raises :class:`SchemaTooLarge` (a ``CallRejected``: the client gets a 400).

**One budget per request.** :func:`check_schemas` builds all of a request's schemas (every
tool's parameters and its response format) against *one* budget: a fresh budget per schema
let 1,000 tools of 4,000 items each (190 bytes apiece) cost 4 million values, 6–10 s of the
proxy's event loop. 4,096 values and 100,000 characters for the whole request: the agents'
whole tool sets build 20–26 values and 110–195 characters (Claude Code's 12 tools, Codex's 12,
Qwen Code's 10, bench/fixtures/agent_tools/, measured by tests/unit/core/test_schema_instance.py),
so the budget is over 150 times what they need, and at their 2–4 values a tool it holds more
tools than a request may offer (proxy/callpath/bounds.py ``MAX_TOOLS``, 512). 100,000
characters is ~25,000 tokens at 4 bytes a token (core/calls.py ``BYTES_PER_TOKEN``), beyond
what a model writes in one tool call or answer. The largest build the budget allows takes
~20 ms (``bench/schema_bomb.py``; docs/operations.md, "Bounds, quotas and timeouts"). The
simulated engine gives each build its own budget (one tool call's arguments, or one JSON
answer), so a runtime called directly refuses a schema past it too.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from talaria.core.calls import ToolSpec
from talaria.core.types import CallRejected

MAX_DEPTH = 8
"""Nested schemas deeper than this get ``None`` (a recursive ``$ref`` would never end)."""

MAX_INSTANCE_VALUES = 4_096
"""The most JSON values (objects, arrays, strings, numbers, ...) the instances of one request's
schemas may hold together (one build of the simulated engine: its instance alone)."""

MAX_INSTANCE_CHARS = 100_000
"""The most characters of strings (values and object keys) the same instances may hold."""

DESCRIPTION_READ_CHARS = 1_000
"""Only this much of a ``description`` is read (for "absolute"): a build visits a schema many
times, and its description is the client's text."""

NAME_READ_CHARS = 100
"""Only this much of a property's name picks its string value."""

MAX_REF_CHARS = 1_000
"""A longer ``$ref`` resolves to nothing (``{}``)."""


class SchemaTooLarge(CallRejected):
    """A schema whose instance would pass the budget: the caller's fault (a 400)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__("schema_too_large", message, param)


@dataclass
class InstanceBudget:
    """What the builds sharing it (one request's schemas, or one build) may still produce;
    :meth:`take` raises ``SchemaTooLarge`` past it."""

    values: int = MAX_INSTANCE_VALUES
    chars: int = MAX_INSTANCE_CHARS

    def take(self, values: int = 0, chars: int = 0) -> None:
        """Spend ``values`` values and ``chars`` characters; ``SchemaTooLarge`` if not left."""
        self.require(values, chars)
        self.values -= values
        self.chars -= chars

    def require(self, values: int = 0, chars: int = 0) -> None:
        """Raise unless ``values`` and ``chars`` are left (nothing is taken)."""
        if values > self.values or chars > self.chars:
            raise SchemaTooLarge(
                f"its instance would hold more than {MAX_INSTANCE_VALUES:,} values or "
                f"{MAX_INSTANCE_CHARS:,} characters (minItems, minLength or a recursive $ref "
                "ask for too much)"
            )


_COMMAND_NAMES = frozenset({"command", "cmd", "commands", "script", "shell_command"})
_PATTERN_NAMES = frozenset({"pattern", "glob", "glob_pattern", "include", "filter"})
_QUERY_NAMES = frozenset({"query", "q", "regex", "search", "text", "keyword", "keywords"})
_DIR_NAMES = frozenset({"path", "dir", "directory", "dir_path", "cwd", "workdir", "root", "folder"})


def name_words(name: str) -> set[str]:
    """The lower-case words of a property name, split at camelCase and non-alphanumerics
    (``"filePath"``, ``"file_path"`` → ``{"file", "path"}``)."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return {w for w in re.split(r"[^a-zA-Z0-9]+", spaced.lower()) if w}


def string_for(name: str, description: str = "") -> str:
    """A harmless value for a string property called ``name`` (its first ``NAME_READ_CHARS``
    characters: an array repeats the same name for each of its items)."""
    return _string_for(name[:NAME_READ_CHARS], "absolute" in description.lower())


@functools.lru_cache(maxsize=1024)
def _string_for(name: str, absolute: bool) -> str:
    key = name.lower()
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
    if len(ref) > MAX_REF_CHARS:
        return {}
    node: Any = root
    for part in ref[2:].split("/"):
        if not isinstance(node, dict) or part not in node:
            return {}
        node = node[part]
    return node if isinstance(node, dict) else {}


def instance(
    schema: Any,
    name: str = "",
    description: str = "",
    root: Mapping[str, Any] | None = None,
    depth: int = 0,
    budget: InstanceBudget | None = None,
) -> Any:
    """A value valid against ``schema`` (see the module docstring for what is covered), built
    within ``budget`` (a fresh :class:`InstanceBudget` when None): every visit costs a value,
    a value the schema gives (``const``, ``enum``, ``default``) costs its size."""
    budget = InstanceBudget() if budget is None else budget
    budget.take(values=1)
    if not isinstance(schema, dict) or depth > MAX_DEPTH:
        return None
    root = schema if root is None else root
    schema = _resolve(schema, root)
    given = schema.get("description")
    if isinstance(given, str):
        description = given[:DESCRIPTION_READ_CHARS]
    if "const" in schema:
        return _literal(schema["const"], budget)
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return _literal(schema["enum"][0], budget)
    if "default" in schema and schema["default"] is not None:
        return _literal(schema["default"], budget)
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            chosen = next(
                (o for o in options if isinstance(o, dict) and o.get("type") != "null"),
                options[0],
            )
            return instance(chosen, name, description, root, depth + 1, budget)
    if isinstance(schema.get("allOf"), list):
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            value = instance(part, name, description, root, depth + 1, budget)
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
        return _object(schema, root, depth, budget)
    if kind == "array":
        return _array(schema, name, description, root, depth, budget)
    if kind == "string":
        return _string(schema, name, description, budget)
    if kind in ("integer", "number"):
        return _number(schema, kind, budget)
    if kind == "boolean":
        return False
    return None


def _object(
    schema: Mapping[str, Any], root: Mapping[str, Any], depth: int, budget: InstanceBudget
) -> dict[str, Any]:
    properties = schema.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    required = schema.get("required")
    out: dict[str, Any] = {}
    for key in required if isinstance(required, list) else []:
        if not isinstance(key, str):
            continue
        budget.take(chars=len(key))
        sub = properties.get(key, {})
        out[key] = instance(sub, key, "", root, depth + 1, budget)
    return out


def _array(
    schema: Mapping[str, Any],
    name: str,
    description: str,
    root: Mapping[str, Any],
    depth: int,
    budget: InstanceBudget,
) -> list[Any]:
    prefix = schema.get("prefixItems")
    if isinstance(prefix, list) and prefix:
        return [instance(p, name, description, root, depth + 1, budget) for p in prefix]
    items = schema.get("items", {})
    minimum = schema.get("minItems")
    count = minimum if isinstance(minimum, int) and minimum > 0 else 0
    if name.lower() in _COMMAND_NAMES:
        count = max(count, 1)  # ["ls"]: a command as an argv list
    budget.require(values=count)  # refuse before expanding: each item takes at least one
    return [instance(items, name, description, root, depth + 1, budget) for _ in range(count)]


def _literal(value: Any, budget: InstanceBudget) -> Any:
    """``value`` (a JSON value from the schema), after taking its size from ``budget``: one
    value per node, its strings' characters; the walk stops as soon as the budget is spent."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            budget.take(values=1, chars=len(node))
        elif isinstance(node, int | float) and not isinstance(node, bool):
            budget.take(values=1, chars=_digits(node))
        else:
            budget.take(values=1)
        if isinstance(node, dict):
            for key, item in node.items():
                budget.take(chars=len(key) if isinstance(key, str) else 0)
                stack.append(item)
        elif isinstance(node, list):
            stack.extend(node)
    return value


def _string(schema: Mapping[str, Any], name: str, description: str, budget: InstanceBudget) -> str:
    value = string_for(name, description)
    low, high = schema.get("minLength"), schema.get("maxLength")
    if isinstance(high, int) and len(value) > high:
        value = value[: max(0, high)]
    if isinstance(low, int) and len(value) < low:
        budget.take(chars=low)  # refuse before the padding is allocated
        return value + "x" * (low - len(value))
    budget.take(chars=len(value))
    return value


def _number(schema: Mapping[str, Any], kind: str, budget: InstanceBudget) -> int | float:
    """1, moved into ``[minimum, maximum]`` (exclusive bounds ±1); a non-finite bound is left
    out. Its digits count as characters."""

    def bound(key: str) -> float | None:
        given = schema.get(key)
        if isinstance(given, bool) or not isinstance(given, int | float):
            return None
        return None if isinstance(given, float) and not math.isfinite(given) else given

    value: float = 1
    if (low := bound("minimum")) is not None:
        value = max(value, low)
    if (ex_low := bound("exclusiveMinimum")) is not None:
        value = max(value, ex_low + 1)
    if (high := bound("maximum")) is not None:
        value = min(value, high)
    if (ex_high := bound("exclusiveMaximum")) is not None:
        value = min(value, ex_high - 1)
    number = int(value) if kind == "integer" else value
    budget.take(chars=_digits(number))
    return number


def _digits(number: int | float) -> int:
    """Characters of ``number`` in JSON: ~log10 for an int (str() of a huge int is slow)."""
    if isinstance(number, int):
        return 1 + (number.bit_length() * 30103) // 100000 + (number < 0)
    return len(repr(number))


def response_schema(response_format: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The JSON schema of a ``json_schema`` response format (OpenAI's ``{"type":
    "json_schema", "json_schema": {"name", "schema"}}``), ``{"type": "object"}`` when it gives
    none; None for any other format."""
    if not response_format or response_format.get("type") != "json_schema":
        return None
    spec = response_format.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, Mapping) else None
    return schema if isinstance(schema, dict) else {"type": "object"}


def check_schemas(
    tools: Sequence[ToolSpec],
    response_format: Mapping[str, Any] | None,
    format_param: str,
    budget: InstanceBudget | None = None,
) -> InstanceBudget:
    """Build every tool's schema and the response format's within one ``budget`` (a fresh
    :class:`InstanceBudget` when None: a request's whole budget); return what is left of it.
    What the simulated engine would write is exactly these builds, and a real model would
    have to write instances at least this large.

    Past the budget, ``SchemaTooLarge``: naming the schema (``param`` ``tools[i]`` or
    ``format_param``) when it alone passes a whole budget, else naming the request (``param``
    ``tools``: its schemas pass the budget only together)."""
    budget = InstanceBudget() if budget is None else budget
    for i, tool in enumerate(tools):
        if tool.parameters:
            what = f"The schema of tool {tool.name[:64]!r}"
            _check(tool.parameters, budget, f"tools[{i}]", what)
    schema = response_schema(response_format)
    if schema is not None:
        _check(schema, budget, format_param, "The response format's schema")
    return budget


def _check(schema: Mapping[str, Any], budget: InstanceBudget, param: str, what: str) -> None:
    whole = budget.values == MAX_INSTANCE_VALUES and budget.chars == MAX_INSTANCE_CHARS
    try:
        instance(schema, budget=budget)
    except SchemaTooLarge as exc:
        if whole or not _fits_alone(schema):
            raise SchemaTooLarge(f"{what} is too large: {exc}.", param) from None
        raise SchemaTooLarge(
            "The request's schemas together are too large: their instances would hold more "
            f"than {MAX_INSTANCE_VALUES:,} values or {MAX_INSTANCE_CHARS:,} characters in all "
            "(its tools' parameters and its response format share one budget).",
            "tools",
        ) from None


def _fits_alone(schema: Mapping[str, Any]) -> bool:
    """Whether ``schema`` builds within a whole budget of its own (at most one more build)."""
    try:
        instance(schema)
    except SchemaTooLarge:
        return False
    return True
