"""How a ``VLLMEngine`` behaves around its ``AsyncLLM``: its options (the rate model of its timing
estimates is runtime/engines/timing.py's), and how vLLM's serving layer treats its chat calls
(the node config's model options become these, build.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from talaria.runtime.costmodel import CostModel
from talaria.runtime.engines.timing import RateModel


@dataclass(frozen=True)
class VLLMEngineOptions:
    """How a ``VLLMEngine`` behaves around its ``AsyncLLM``."""

    sleep_mode: bool
    """GPU path (sleep / wake at switches) if True; CPU gate if False."""
    sleep_level: int = 1
    """vLLM's sleep level on the GPU path: 1 keeps the weights in pinned host memory, 2
    discards them and a wake reloads them from the model's files (switching.py)."""
    max_model_len: int = 2048
    ignore_eos: bool = True
    """Generate exactly ``max_output_tokens`` (replay semantics; right for random weights)."""
    rates: RateModel = field(default_factory=RateModel)
    host_kv_survives_sleep: bool = False
    """A KV connector's host tier keeps session KV across ``sleep`` (LMCache; not the native
    OffloadingConnector in vLLM 0.32.0, whose tier is reset on sleep)."""
    weight_bytes_per_device: float | None = None
    """Bytes of weights each GPU holds when awake (staging needs that much free)."""
    device_bytes: float | None = None
    """Memory of one of the engine's GPUs (GPU path). Awake, the engine holds
    ``memory_share × device_bytes`` of each: its weights and its KV pool."""
    memory_share: float = 0.9
    """The engine's ``gpu_memory_utilization`` (vLLM's default 0.9): its split of each GPU.
    Engines whose shares sum to at most 1 can be awake together (co-residency)."""
    free_device_bytes: Callable[[], float] | None = None
    """Free memory now on the engine's fullest GPU; without it (or the weight bytes) staging
    is off."""
    sampling: Mapping[str, Any] = field(default_factory=dict)
    """Extra ``SamplingParams`` fields (e.g. ``temperature=0``)."""
    cost: CostModel | None = None
    """A calibrated cost model of this engine (its profile has a ``StepFit`` for the model):
    if given, service and recompute estimates come from it instead of ``rates``, exactly as
    the simulator estimates them."""
    chat: ChatOptions | None = None
    """Serve chat calls through vLLM's OpenAI serving layer (chat.py): for a model with a
    Hugging Face tokenizer. None: the byte tokenizer's own template (the tiny test models)."""


@dataclass(frozen=True)
class ChatOptions:
    """How vLLM's serving layer treats this model's chat calls (``vllm serve``'s flags)."""

    model_path: str
    tool_parser: str | None = None
    """``--tool-call-parser`` (auto tool choice is on when set)."""
    reasoning_parser: str | None = None
    """``--reasoning-parser``."""
    tool_strict_level: str = "parameter"
    """``--tool-strict-level``: ``auto`` (a tool's own ``strict``), ``function`` or
    ``parameter`` (every tool's arguments held to its schema when the tool choice is named or
    ``required``; the default here, build.py says why)."""
    chat_template: str | None = None
    """``--chat-template`` (a file or the template itself); None: the model's own."""
    special_tokens: tuple[str, ...] = ()
    """The tokenizer's special tokens: removed from reply text (vLLM keeps them in when a tool
    parser needs to see them, e.g. ``<|endoftext|>`` after a SmolLM2 reply with tools)."""
