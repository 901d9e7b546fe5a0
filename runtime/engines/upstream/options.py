"""The options of an ``engine = "openai"`` model (a node TOML's ``[[model]]``), checked once
when the node is built: a bad value is a ``NodeConfigError`` naming the model and the option."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from talaria.runtime.config_fields import NodeConfigError
from talaria.runtime.engines.priorities import SERVER_PRIORITIES, ServerPriority
from talaria.runtime.engines.timing import RateModel

SleepKind = Literal["vllm", "sglang", "none"]
SLEEP_KINDS: tuple[SleepKind, ...] = ("vllm", "sglang", "none")
CacheIsolation = Literal["salt", "hide", "share"]
CACHE_ISOLATIONS: tuple[CacheIsolation, ...] = ("salt", "hide", "share")
"""How tenants' prefixes are kept apart on one server (``UpstreamOptions.cache_isolation``)."""

UPSTREAM_RATES = RateModel(
    prefill_s_per_token=2e-5,
    decode_step_s=2e-2,
    decode_step_s_per_seq=5e-4,
    wake_s=5.0,
    kv_wake_s=1.0,
    kv_restore_s_per_token=0.0,
)
"""Assumed timings of an upstream server until measured, for the SP budget and status only
(est., a mid-sized model on one GPU: 50k prompt tokens/s of prefill, a 20 ms decode step +
0.5 ms per other running sequence, a ~5 s wake from level-1 sleep, ~1 s to wake only the KV
pool after the weights were staged). A node TOML's ``rates = {...}`` overrides any field;
``activate`` replaces ``wake_s`` by the last wake it measured."""


@dataclass(frozen=True)
class UpstreamOptions:
    """How an ``UpstreamEngine`` reaches and drives its server."""

    url: str
    """The server's OpenAI base URL, normalised to end in ``/v1`` (``base``: without it)."""
    served_model: str
    """The model name the server serves (``/v1/models``), sent as each request's ``model``."""
    api_key: str | None = None
    """The bearer key read from ``api_key_env`` at build time (None: no Authorization)."""
    sleep: SleepKind = "none"
    """Which sleep / wake endpoints the server has (sleep.py)."""
    context_window: int | None = None
    """Given, or read from ``/v1/models`` (``max_model_len``) at start."""
    weight_bytes: float = 0.0
    """What the server holds of the device while awake (weights and KV pool), for the node's
    co-residency accounting; 0: unknown (the node then keeps it resident beside the others)."""
    device_bytes: float | None = None
    """The memory of the device the node's upstream servers share (one GPU's); with every
    engine of the node giving it, co-residency fits their ``weight_bytes`` into it."""
    staging: bool = False
    """``sleep = "vllm"`` only: wake the weights ahead of a switch (``/wake_up?tags=weights``)
    while the outgoing server is still awake. Off by default: the engine cannot see the
    device's free memory, so only the operator knows that both fit."""
    rates: RateModel = field(default_factory=lambda: UPSTREAM_RATES)
    timeout_s: float = 600.0
    """The longest wait for one read of a stream, and for the whole of a sleep or a wake (a
    wake of vLLM's level-1 sleep moves the weights back at ~10 GB/s per GPU,
    docs/sources.md §4: 70 GB in ~7 s; 600 s leaves room for a loaded host)."""
    cache_isolation: CacheIsolation = "hide"
    """How one tenant is kept from reading another's prefix cache on this server:

    - ``salt``: each call carries its tenant's ``cache_salt`` (vLLM's OpenAI server, 0.9 and
      later: blocks of different salts never match), and the server's ``cached_tokens`` are
      reported as it sends them (checked against the prompt). The default with
      ``sleep = "vllm"``.
    - ``hide``: no salt (SGLang and llama.cpp's server take none); every call reports 0
      cached tokens, whatever the server says. The default otherwise. Why none rather than
      "as many as the session's own earlier calls left": any number read from a shared
      cache, even capped by the session's own history, changes when another tenant sends
      the same tokens after an eviction the caller can force, so it stays an oracle; the
      server's figure still sets the call's KV source (operator-only, in the call record).
    - ``share``: no salt, ``cached_tokens`` as sent: the operator's word that the server's
      tenants may learn each other's prefixes (one tenant, or tenants that trust each other).

    Whatever the mode, timing (a cached prefix answers sooner) is visible without a salt."""
    priority: ServerPriority = "none"
    """Whether each call carries its class as the server's ``priority`` field, and in whose
    convention (runtime/engines/priorities.py): ``vllm`` for a vLLM server started with
    ``--scheduling-policy priority`` (vLLM 0.32 under its default first-come policy takes the
    field and ignores it; its field's description says an error), ``sglang`` for an SGLang
    server started with ``--enable-priority-scheduling`` (its default polarity and preemption
    threshold), ``none`` (the default): not sent. The server then orders its own waiting
    queue by class, and SGLang preempts a running lower-class request for a higher one; the
    node's fair queue orders what it sends either way."""
    models_timeout_s: float = 30.0
    """The whole of ``GET /v1/models`` (at start and at placement): a list of a few models is
    a few kilobytes served from memory; 30 s is generous on any network and bounds how long
    a placement may hold the node's placement lock."""
    call_timeout_s: float = 1800.0
    """The whole of one call, from its request to its stream's end, whatever arrives meanwhile
    (a stream of comments or keep-alives included): 32,768 output tokens (a common output
    limit) at a 50 ms decode step (a heavily batched server) take 27 minutes."""
    models_max_bytes: int = 1 << 20
    """Bytes of ``GET /v1/models`` (and of any other plain answer: the sleep endpoints):
    vLLM's entry for one model is ~500 bytes, so 1 MiB lists about 2,000 models."""
    line_max_bytes: int = 1 << 20
    """Bytes of one line of a call's stream: a chunk carries one step's tokens (vLLM: one
    token, its logprobs, ~0.3-2 KB) or, from some tool parsers, a whole tool call's
    arguments at once; 1 MiB is over 4,000 tokens at the most generous 256 bytes a token
    (usage.py ``MAX_TOKEN_BYTES``)."""
    reply_bytes_per_token: int = 4096
    """Bytes a call's stream may carry per output token it may generate: the stream is cut at
    ``REPLY_BASE_BYTES`` (64 KiB: the role, usage and ``[DONE]`` lines) + ``max_tokens`` ×
    this. A vLLM chunk of one token is ~300 bytes, ~2 KB with 20 top logprobs (each
    alternative ~80 bytes of JSON); 4 KiB is twice that."""

    @property
    def base(self) -> str:
        """The server's root (where vLLM's and SGLang's sleep endpoints are)."""
        return self.url.removesuffix("/v1")


def normalise_url(url: str) -> str:
    """``http://host:port``, ``…/`` or ``…/v1/`` → ``http://host:port/v1``."""
    url = url.strip().rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def _number(name: str, model: str, value: Any, *, integer: bool = False) -> float:
    ok = (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )
    if not ok or (integer and not isinstance(value, int)):
        kind = "a positive integer" if integer else "a positive number"
        raise NodeConfigError(f"model {model}: {name} must be {kind}, not {value!r}")
    return float(value)


def _window(model: str, value: Any) -> int:
    return int(_number("context_window", model, value, integer=True))


BOUNDS = ("timeout_s", "models_timeout_s", "call_timeout_s", "models_max_bytes",
          "line_max_bytes", "reply_bytes_per_token")  # fmt: skip
"""The options that bound what is read from the server (all positive; the byte ones whole)."""
KNOWN = frozenset(
    {"url", "served_model", "api_key_env", "sleep", "context_window", "weight_bytes",
     "device_bytes", "staging", "rates", "cache_isolation", "priority", *BOUNDS}
)  # fmt: skip


def upstream_options(model: str, options: Mapping[str, Any]) -> UpstreamOptions:
    """The ``[[model]]`` options of an upstream model (``model``: its name), checked."""
    unknown = sorted(set(options) - KNOWN)
    if unknown:
        raise NodeConfigError(
            f"model {model}: unknown option(s) {', '.join(unknown)} for engine 'openai' "
            f"(known: {', '.join(sorted(KNOWN))})"
        )
    url = options.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise NodeConfigError(f"model {model}: engine 'openai' needs a 'url' (http[s]://…)")
    sleep = options.get("sleep", "none")
    if sleep not in SLEEP_KINDS:
        raise NodeConfigError(f"model {model}: sleep must be one of {SLEEP_KINDS}, not {sleep!r}")
    key_env = options.get("api_key_env")
    api_key = None
    if key_env is not None:
        api_key = os.environ.get(str(key_env))
        if not api_key:
            raise NodeConfigError(f"model {model}: api_key_env {key_env!r} is not set")
    window = options.get("context_window")
    rates = options.get("rates") or {}
    if not isinstance(rates, Mapping):
        raise NodeConfigError(f"model {model}: rates must be a table of RateModel fields")
    try:
        rate_model = RateModel(**{**UPSTREAM_RATES.__dict__, **rates})
    except TypeError as exc:
        raise NodeConfigError(f"model {model}: rates: {exc}") from exc
    device = options.get("device_bytes")
    weights = options.get("weight_bytes")
    isolation = options.get("cache_isolation", "salt" if sleep == "vllm" else "hide")
    if isolation not in CACHE_ISOLATIONS:
        raise NodeConfigError(
            f"model {model}: cache_isolation must be one of {CACHE_ISOLATIONS}, not {isolation!r}"
        )
    priority = options.get("priority", "none")
    if priority not in SERVER_PRIORITIES:
        raise NodeConfigError(
            f"model {model}: priority must be one of {SERVER_PRIORITIES}, not {priority!r}"
        )
    defaults = UpstreamOptions("", "")
    bounds = {
        name: _number(name, model, options.get(name, getattr(defaults, name)),
                      integer=name.endswith("_bytes") or name.endswith("_token"))
        for name in BOUNDS
    }  # fmt: skip
    return UpstreamOptions(
        url=normalise_url(url),
        served_model=str(options.get("served_model") or model),
        api_key=api_key,
        sleep=sleep,
        context_window=None if window is None else _window(model, window),
        weight_bytes=0.0 if weights is None else _number("weight_bytes", model, weights),
        device_bytes=None if device is None else _number("device_bytes", model, device),
        staging=bool(options.get("staging", False)) and sleep == "vllm",
        rates=rate_model,
        cache_isolation=isolation,
        priority=priority,
        timeout_s=bounds["timeout_s"],
        models_timeout_s=bounds["models_timeout_s"],
        call_timeout_s=bounds["call_timeout_s"],
        models_max_bytes=int(bounds["models_max_bytes"]),
        line_max_bytes=int(bounds["line_max_bytes"]),
        reply_bytes_per_token=int(bounds["reply_bytes_per_token"]),
    )  # fmt: skip
