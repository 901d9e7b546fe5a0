"""KV sizing and prefix prediction for one vLLM engine.

vLLM owns its KV memory and does not say which sessions' KV it keeps, so the engine keeps its
own record (``SessionMemory``): each session's last context (prompt + output ids) and the sleep
epoch it was computed in. From it the engine predicts, before a call runs, how much of the
prompt a prefix cache will skip and from where (``predict``), classifies what vLLM then
reports (``classify``), and tells the node's status which sessions' KV it probably holds
(``session_kv``).
"""

from __future__ import annotations

import zlib
from array import array
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from talaria.core.types import CallRequest, KvSource
from talaria.runtime.engines.tokenizer import BOS_ID, BYTE_OFFSET

SESSION_MEMORY = 1024
"""Sessions whose last context (prompt + output ids, 4 bytes a token) the engine remembers, LRU."""

_DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "float8": 1,
    "fp8": 1,
}


@dataclass(frozen=True)
class KvShape:
    """The KV footprint of one token, from the model config.

    Bytes per token on the node = 2 (K and V) × layers × physical KV heads × head_dim × dtype
    bytes; with tensor parallelism wider than the KV heads, each GPU holds a replica of one head,
    so the physical heads are ``max(kv_heads, tensor_parallel_size)``. A sequence occupies whole
    blocks of ``block_tokens``. (Standard GQA/MHA attention; MLA models differ.)
    """

    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    block_tokens: int = 16
    tensor_parallel_size: int = 1

    @property
    def bytes_per_token(self) -> int:
        heads = max(self.kv_heads, self.tensor_parallel_size)
        return 2 * self.layers * heads * self.head_dim * self.dtype_bytes

    def kv_bytes(self, tokens: int) -> float:
        blocks = -(-max(0, tokens) // self.block_tokens)
        return float(blocks * self.block_tokens * self.bytes_per_token)

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any],
        *,
        block_tokens: int = 16,
        tensor_parallel_size: int = 1,
        kv_cache_dtype: str = "auto",
    ) -> KvShape:
        """From a Hugging Face ``config.json`` (its ``text_config`` for multimodal models)."""
        text = config.get("text_config")
        cfg: Mapping[str, Any] = text if isinstance(text, Mapping) else config
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
        if kv_cache_dtype != "auto":
            dtype_bytes = 1 if kv_cache_dtype.startswith("fp8") else _DTYPE_BYTES[kv_cache_dtype]
        else:
            dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or config.get("torch_dtype"))
            dtype_bytes = _DTYPE_BYTES.get(dtype.removeprefix("torch."), 2)
        return cls(
            layers=int(cfg["num_hidden_layers"]),
            kv_heads=kv_heads,
            head_dim=head_dim,
            dtype_bytes=dtype_bytes,
            block_tokens=block_tokens,
            tensor_parallel_size=tensor_parallel_size,
        )


@dataclass
class SessionContext:
    """What the engine remembers of a session: its last call's ids and when it finished."""

    context: array[int]
    """Prompt + output ids of the session's last call on this engine."""
    epoch: int
    """The engine's sleep count when that call finished."""


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix (compared 256 ids at a time, as int arrays)."""
    a = a if isinstance(a, array) else array("i", a)
    b = b if isinstance(b, array) else array("i", b)
    n = min(len(a), len(b))
    i = 0
    step = 256
    while i + step <= n and a[i : i + step] == b[i : i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


def filler(seed: str, n: int) -> list[int]:
    """``n`` deterministic printable-ASCII byte ids (a-z) from ``seed`` (no global RNG)."""
    x = zlib.crc32(seed.encode()) or 1
    out = []
    for _ in range(n):
        x = (1103515245 * x + 12345) & 0x7FFFFFFF
        out.append(BYTE_OFFSET + 97 + (x >> 16) % 26)
    return out


class SessionMemory:
    """The sessions an engine served lately (``SESSION_MEMORY``, least recently used
    forgotten), and what follows from them."""

    def __init__(self, block_tokens: int, host_kv_survives_sleep: bool) -> None:
        self.block_tokens = block_tokens
        self._host = host_kv_survives_sleep
        self._sessions: OrderedDict[str, SessionContext] = OrderedDict()

    def get(self, session_key: str) -> SessionContext | None:
        return self._sessions.get(session_key)

    def remember(self, session_key: str, context: list[int], epoch: int) -> None:
        self._sessions[session_key] = SessionContext(array("i", context), epoch)
        self._sessions.move_to_end(session_key)
        while len(self._sessions) > SESSION_MEMORY:
            self._sessions.popitem(last=False)

    def synthetic_ids(self, request: CallRequest) -> list[int]:
        """A replayed call without text: the session's previous prompt + output (the first
        ``shared_prefix_tokens`` of it, if given), then deterministic filler, ``prompt_tokens``
        in all; so continuations share their prefix as real agent calls do."""
        n = max(1, request.prompt_tokens)
        state = self._sessions.get(request.session_key)
        base = list(state.context) if state is not None else [BOS_ID]
        keep = len(base)
        if request.shared_prefix_tokens is not None and state is not None:
            keep = min(keep, request.shared_prefix_tokens)
        ids = base[: min(keep, n)]
        seed = f"{request.session_key}/{request.call_index}/{request.request_id}"
        return ids + filler(seed, n - len(ids))

    def predict(self, request: CallRequest, ids: Sequence[int], epoch: int) -> tuple[KvSource, int]:
        """Where the prefix will come from and how many tokens of it (whole blocks, never the
        last prompt token), judged from the record of the session."""
        state = self._sessions.get(request.session_key)
        if state is None:
            known = request.call_index > 0 or bool(request.shared_prefix_tokens)
            return (KvSource.RECOMPUTE if known else KvSource.NEW), 0
        shared = min(common_prefix(state.context, ids), len(ids) - 1)
        shared -= shared % self.block_tokens
        if shared <= 0:
            return KvSource.RECOMPUTE, 0
        if state.epoch == epoch:
            return KvSource.HBM, shared
        if self._host:
            return KvSource.HOST, shared
        return KvSource.RECOMPUTE, 0

    def classify(self, request: CallRequest, cached: int, epoch: int) -> KvSource:
        """What vLLM's cached-token count means: in the same epoch as the session's previous
        call, the device cache (``HBM``); after a sleep, a host tier (``HOST``); none cached:
        ``NEW`` for a first call, else ``RECOMPUTE``."""
        state = self._sessions.get(request.session_key)
        if cached > 0:
            if state is not None and state.epoch != epoch:
                return KvSource.HOST
            return KvSource.HBM
        if state is not None or request.call_index > 0 or request.shared_prefix_tokens:
            return KvSource.RECOMPUTE
        return KvSource.NEW

    def recomputed(self, request: CallRequest, ids: Sequence[int]) -> int:
        """Tokens of a ``RECOMPUTE`` call's prompt that a kept KV would have saved."""
        state = self._sessions.get(request.session_key)
        if state is not None:
            return common_prefix(state.context, ids)
        return min(request.shared_prefix_tokens or 0, len(ids))

    def held(self, epoch: int) -> dict[str, tuple[int, KvSource]]:
        """Sessions whose KV the engine probably still holds: (tokens, ``HBM`` if no sleep
        since, else ``HOST`` when a host tier survives sleep)."""
        out: dict[str, tuple[int, KvSource]] = {}
        for session_key, state in self._sessions.items():
            if state.epoch == epoch:
                out[session_key] = (len(state.context), KvSource.HBM)
            elif self._host:
                out[session_key] = (len(state.context), KvSource.HOST)
        return out
