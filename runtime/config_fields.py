"""What the fields of a node config's entries may hold: one table per entry kind, each field
declared once with its type and, for a number, its range (issue 46, item 4).

A node TOML (runtime/config.py) and a model placed over HTTP (``POST /v1/runtime/models``,
runtime/placement_routes.py) are checked against the same tables when they are parsed, before
anything is built from them, so a bad value is one clear error naming the field (a 400, or one
line at start) and never an exception inside the node's scheduling loop:

- **typed**: a number is an ``int`` or a ``float`` (an ``int`` field takes integers only); a
  quoted number (``"1e-4"``) is a string, and a bool (``true``) is not a number;
- **finite**: NaN and ±infinity are refused (TOML writes them ``nan`` and ``inf``, and Python's
  JSON parser reads ``NaN``, ``Infinity`` and ``1e400``), in a listed field and anywhere else in
  the entry (an engine argument no table lists, inside a list or a table);
- **in range**: each number field has bounds, wide enough for any real deployment, that keep
  every estimate the node derives from it finite (a rate of 1e308 s per token times a prompt's
  tokens is infinity, which JSON cannot carry in the node's status).

The tables: ``NODE_FIELDS`` (the ``[node]`` table), ``RATE_FIELDS`` (a model's ``rates``, the
``RateModel`` of runtime/engines/timing.py), and one per engine's ``[[model]]`` options
(``VLLM_FIELDS``, ``UPSTREAM_FIELDS``), each under its engine's name in ``ENGINE_FIELDS``: the
engines a node config may name, which runtime/config.py reads without the engine registry
(runtime/engine_kinds.py registers each with its builder, ``EngineKind.fields``). A key a table
does not list is left to its engine's own checks (finite still). Adding an option to an engine:
one row in its table.
A value that is wrong anywhere in a node config (a field here, or an engine's own check of its
options) is a ``NodeConfigError``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

FieldKind = Literal["int", "float", "str", "bool", "table", "any"]
"""What a field holds: a number (``int``, or ``float``, which takes integers too), a string, a
bool, a table of its own fields, or ``any`` (checked by its own parser)."""


class NodeConfigError(ValueError):
    """The node configuration file (or a model placed over HTTP) is missing a field or names
    something unknown; the message names where."""


class FieldError(ValueError):
    """A field of an entry holds what its table refuses; the message names the field (with
    its table, ``rates.wake_s``) and the reason."""


@dataclass(frozen=True)
class Field:
    """One field of an entry: its kind and, for a number, its range, ``[low, high]`` (``(low,
    high]`` with ``above``), in ``unit``; a table's ``fields`` are its own rows (a key they do
    not list is refused)."""

    kind: FieldKind
    low: float = -math.inf
    high: float = math.inf
    above: bool = False
    """``low`` itself is out of range (a value must be greater)."""
    unit: str = ""
    fields: Mapping[str, Field] | None = None

    def range_text(self) -> str:
        """The range as the error messages and docs write it, e.g. ``(0, 86400] s``."""
        low = "(" if self.above else "["
        text = f"{low}{self.low:g}, {self.high:g}]"
        return f"{text} {self.unit}" if self.unit else text

    def refusal(self, value: Any) -> str | None:
        """Why ``value`` does not fit this field (a phrase: "must be …, not …"), or None."""
        if self.kind == "any":
            return None
        if self.kind in _SHAPES:
            shape, phrase = _SHAPES[self.kind]
            return None if isinstance(value, shape) else f"must be {phrase}, not {_shown(value)}"
        if isinstance(value, bool) or not isinstance(value, int | float):
            kind = "an integer" if self.kind == "int" else "a number"
            return f"must be {kind}, not {_shown(value)}"
        if self.kind == "int" and not isinstance(value, int):
            return f"must be an integer, not {_shown(value)}"
        if not _finite(value):
            return f"must be a finite number, not {_shown(value)}"
        low_ok = value > self.low if self.above else value >= self.low
        if not (low_ok and value <= self.high):
            return f"must be in {self.range_text()}, not {_shown(value)}"
        return None


_SHAPES: dict[str, tuple[type, str]] = {
    "str": (str, "a string"),
    "bool": (bool, "true or false"),
    "table": (Mapping, "a table"),
}


def _finite(value: int | float) -> bool:
    """A finite number (an integer past float's range, e.g. 10**400, counts as infinite)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _shown(value: Any) -> str:
    """``value`` in an error message: a string quoted and named (a quoted number is the usual
    mistake), a bool as TOML and JSON write it, anything else short."""
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float | int):
        return f"{value:g}" if isinstance(value, float) or _finite(value) else "a huge integer"
    return type(value).__name__


def check_fields(table: Mapping[str, Field], entry: Mapping[str, Any], prefix: str = "") -> None:
    """Check every key of ``entry`` that ``table`` lists (a table's own keys against its
    ``fields``: an unknown one is refused), and every number anywhere in ``entry`` is finite;
    ``FieldError`` names the first field that fails (``prefix``: its table, ``rates.``)."""
    for key, value in entry.items():
        name = f"{prefix}{key}"
        spec = table.get(key)
        if spec is None:
            check_finite(value, name)
            continue
        reason = spec.refusal(value)
        if reason is not None:
            raise FieldError(f"{name} {reason}")
        if spec.kind == "table" and spec.fields is not None:
            unknown = sorted(set(value) - set(spec.fields))
            if unknown:
                raise FieldError(
                    f"{name}: unknown keys {unknown}; it may hold {', '.join(spec.fields)}"
                )
            check_fields(spec.fields, value, f"{name}.")


def check_finite(value: Any, name: str) -> None:
    """Every number in ``value`` (within its lists and tables too) is finite; else a
    ``FieldError`` naming where (``name``, ``name[2]``, ``name.key``)."""
    if isinstance(value, bool | str) or value is None:
        return
    if isinstance(value, int | float):
        if not _finite(value):
            raise FieldError(f"{name} must be a finite number, not {_shown(value)}")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            check_finite(item, f"{name}.{key}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            check_finite(item, f"{name}[{i}]")


# -- the tables -------------------------------------------------------------------------------

DAY_S = 86400.0
TOKENS_MAX = 2**24
"""The longest window a field may name (16.8M tokens: the longest served today are 10M)."""
BYTES_MAX = 1e15
"""The most bytes a size field may name (1 PB: the largest checkpoints are a few TB)."""

NODE_FIELDS: Mapping[str, Field] = {
    "name": Field("str"),
    "policy": Field("str"),
    "server": Field("str"),
    "profile": Field("str"),
    "gpus": Field("any"),  # parse_gpus (runtime/config.py)
    "quantum_s": Field("float", 0, DAY_S, above=True, unit="s"),
    "time_scale": Field("float", 0, 1e6, above=True, unit="simulated s per s"),
    "class_slowdown": Field("float", 1, 100, unit="× a step"),
    "preempt_limit": Field("int", 0, 10**6, unit="times"),
    "starvation_quanta": Field("float", 0, 1e4, above=True, unit="quanta"),
}
"""The ``[node]`` table: a slot of more than a day is no time sharing; a simulated engine's
clock at most a million times real time. The fair queue's operator bounds
(runtime/scheduling/config.py ``SchedulerConfig``, ``FAIR_QUEUE_KEYS``): a lower class may slow
a higher class's steps by at least nothing (1×); a call may be held out of the steps never
(0) or a million times at most; a call is promoted a class after some time in quanta."""

FAIR_QUEUE_KEYS = ("class_slowdown", "preempt_limit", "starvation_quanta")
"""The ``[node]`` keys that set the node's ``SchedulerConfig`` fields of the same names."""

RATE_FIELDS: Mapping[str, Field] = {
    "prefill_s_per_token": Field("float", 0, 1.0, unit="s per token"),
    "decode_step_s": Field("float", 0, 60.0, unit="s"),
    "decode_step_s_per_seq": Field("float", 0, 60.0, unit="s per sequence"),
    "wake_s": Field("float", 0, 3600.0, unit="s"),
    "kv_wake_s": Field("float", 0, 3600.0, unit="s"),
    "kv_restore_s_per_token": Field("float", 0, 1.0, unit="s per token"),
}
"""A model's ``rates`` (``RateModel``'s fields, every one; tests/unit/runtime/test_config_fields.py
holds them equal). The bounds are 10⁴× the slowest measured figures (the tiny models on a
2-core CPU: ~1e-4 s per prefill token, ~5 ms a decode step) and keep an estimate over a
``TOKENS_MAX`` prompt below 2·10⁷ s: finite."""

RATES = Field("table", fields=RATE_FIELDS)

VLLM_FIELDS: Mapping[str, Field] = {
    "max_model_len": Field("int", 1, TOKENS_MAX, unit="tokens"),
    "tensor_parallel_size": Field("int", 1, 64, unit="GPUs"),
    "gpu_memory_utilization": Field("float", 0, 1.0, above=True),
    "kv_offloading_size": Field("float", 0, 1e5, unit="GiB"),
    "dtype": Field("str"),
    "kv_offloading_backend": Field("str"),
    "sleep_level": Field("int", 1, 2),
    "tool_parser": Field("str"),
    "reasoning_parser": Field("str"),
    "tool_strict_level": Field("str"),
    "chat_template": Field("str"),
    "trust_remote_code": Field("bool"),
    "rates": RATES,
}
"""A vLLM model's options (those docs/models.md and docs/deploy-h200.md document; a node's
own TOML may give any other engine argument, checked finite only)."""

UPSTREAM_FIELDS: Mapping[str, Field] = {
    "url": Field("str"),
    "served_model": Field("str"),
    "api_key_env": Field("str"),
    "sleep": Field("str"),
    "context_window": Field("int", 1, TOKENS_MAX, unit="tokens"),
    "weight_bytes": Field("float", 0, BYTES_MAX, unit="bytes"),
    "device_bytes": Field("float", 0, BYTES_MAX, above=True, unit="bytes"),
    "staging": Field("bool"),
    "rates": RATES,
    "timeout_s": Field("float", 0, DAY_S, above=True, unit="s"),
    "cache_isolation": Field("str"),
    "priority": Field("str"),
    "models_timeout_s": Field("float", 0, DAY_S, above=True, unit="s"),
    "call_timeout_s": Field("float", 0, DAY_S, above=True, unit="s"),
    "models_max_bytes": Field("int", 1, BYTES_MAX, unit="bytes"),
    "line_max_bytes": Field("int", 1, BYTES_MAX, unit="bytes"),
    "reply_bytes_per_token": Field("int", 1, BYTES_MAX, unit="bytes"),
}
"""An upstream (``engine = "openai"``) model's options (docs/upstream.md); its own parser,
runtime/engines/upstream/options.py, refuses the keys it does not know."""

ENGINE_FIELDS: Mapping[str, Mapping[str, Field]] = {
    "sim": {},
    "vllm": VLLM_FIELDS,
    "openai": UPSTREAM_FIELDS,
}
"""The engines a node TOML may name (``engine = "..."`` of a ``[[model]]``), each with what its
options may hold; runtime/engine_kinds.py's ``ENGINES`` builds each, under the same names
(tests/unit/runtime/test_engine_registry.py holds them equal)."""
