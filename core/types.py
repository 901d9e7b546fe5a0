"""Types that cross the seams: a call as the runtime receives it, and what it reports back."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class KvSource(StrEnum):
    """Where a call's reused prefix came from."""

    NEW = "new"  # first call of a session: nothing to reuse
    HBM = "hbm"  # prefix still in GPU memory: skipped
    HOST = "host"  # prefix restored from host DRAM over PCIe
    RECOMPUTE = "recompute"  # prefix gone: prefilled again


class CallRejected(ValueError):
    """The engine refuses this call as asked: the caller's fault, not the runtime's (the proxy
    answers 400 with ``code``, e.g. ``context_length_exceeded``), unlike a runtime fault."""

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.param = param


@dataclass(frozen=True)
class CallRequest:
    """One LLM call of a session.

    ``prompt_tokens`` is the whole prompt; the part shared with the session's earlier calls is
    found by the runtime (prefix caching), not declared by the caller. ``max_output_tokens``
    bounds generation; the simulated engine generates exactly that many (like ``ignore_eos``).
    ``expected_tool_gap_s`` is the caller's hint of the tool time that follows this call.
    """

    request_id: str
    session_id: str
    model: str
    prompt_tokens: int
    max_output_tokens: int
    call_index: int = 0
    expected_tool_gap_s: float | None = None
    session_final: bool = False
    stream: bool = False
    """The caller wants token deltas as they are generated (``TokenDelta`` events)."""
    shared_prefix_tokens: int | None = None
    messages: tuple[dict[str, Any], ...] | None = None
    """Chat messages, for engines that tokenize (the runtime renders them with the model's chat
    template); the simulated engine only needs ``prompt_tokens``."""
    prompt_text: str | None = None
    """A plain-text prompt (completions), for engines that tokenize."""
    """Tokens of this prompt equal to the session's previous prompt + output. Replay knows it
    from the trace; ``None`` means append-only (the whole cached prefix matches)."""


@dataclass(frozen=True)
class CallResult:
    request_id: str
    session_id: str
    model: str
    node: str
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    arrival_s: float
    admitted_s: float
    first_token_s: float
    finished_s: float
    kv_source: KvSource
    restored_bytes: float
    recomputed_tokens: int
    sp_admitted: bool
    output_text: str | None = None
    """What a real engine generated (None from the simulated engine, whose text is synthetic)."""

    @property
    def latency_s(self) -> float:
        return self.finished_s - self.arrival_s

    @property
    def queue_s(self) -> float:
        return self.admitted_s - self.arrival_s
