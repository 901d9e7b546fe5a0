"""The simulated engine's KV accounting: its sessions' prefixes in the node's ``NodeMemory``.

Prefix reuse per session: a prefix in HBM is skipped; in host DRAM it is restored over PCIe
before the sequence runs; gone, it is prefilled again. A sub-agent's session with no KV of its
own here reuses its parent's KV for the prompt's first ``parent_prefix_tokens`` (prefix caching
across sessions, as vLLM's block hashes give it); the child's own entry is then committed whole
(the shared blocks counted twice: memory is over-, never under-estimated), and a child whose
parent's prefix is not here recomputes it (``KvSource.RECOMPUTE``). Only whole blocks are
reused, and never the last prompt token (vLLM recomputes it to get logits). Memory is
committed at admission for prompt + max output tokens and trimmed to prompt + output at the
finish; idle KV is evicted to make room LRU, with ``class_eviction`` the lowest class first (to
host DRAM when ``host_kv``, else dropped).
"""

from __future__ import annotations

from talaria.core.types import CallRequest, KvSource
from talaria.runtime.costmodel import CostModel
from talaria.runtime.memory.resources import KvLocation, NodeMemory, SessionKv


class SimKv:
    """One simulated engine's sessions in ``memory``: where a call's prefix comes from, what
    admitting it takes, and where KV goes when room is needed or the model sleeps."""

    def __init__(
        self,
        model: str,
        cost: CostModel,
        memory: NodeMemory,
        host_kv: bool,
        class_eviction: bool = False,
    ) -> None:
        self._model = model
        self._class_eviction = class_eviction
        self._cost = cost
        self._memory = memory
        self._host_kv = host_kv
        self._block = cost.profile.block_tokens

    def idle_hbm_bytes(self, enough_bytes: float = float("inf")) -> float:
        """HBM that evicting idle sessions' KV (of every model on the node) would free: all of
        it, or as soon as it reaches ``enough_bytes`` (a walk of those only)."""
        return sum(e.nbytes for e in self._memory.take_evictable(KvLocation.HBM, enough_bytes))

    def reuse(self, request: CallRequest) -> tuple[KvSource, int, SessionKv | None]:
        """Where the call's prefix comes from, how many tokens of it are reused, and the
        session's KV entry on this model (if any)."""
        entry = self._memory.kv.get(request.session_key)
        if entry is not None and entry.model != self._model:
            entry = None
        shared = request.shared_prefix_tokens
        if shared is None:
            shared = entry.tokens if entry is not None else 0
        if entry is None:
            if request.parent_prefix_tokens > 0:
                return (*self._parent_reuse(request), None)
            source = KvSource.NEW if shared == 0 else KvSource.RECOMPUTE
            return source, 0, None
        reusable = min(shared, entry.tokens, request.prompt_tokens - 1)
        reusable -= reusable % self._block
        if reusable <= 0:
            return (KvSource.NEW if shared == 0 else KvSource.RECOMPUTE), 0, entry
        source = KvSource.HBM if entry.location is KvLocation.HBM else KvSource.HOST
        return source, reusable, entry

    def _parent_reuse(self, request: CallRequest) -> tuple[KvSource, int]:
        """Where a child's shared prefix comes from and its reused tokens: the parent's entry
        for this model, whole blocks of ``min(parent_prefix_tokens, its tokens, prompt − 1)``;
        ``RECOMPUTE`` and 0 when the parent's KV is not here."""
        parent = self._memory.kv.get(request.parent_session_key or "")
        if parent is None or parent.model != self._model:
            return KvSource.RECOMPUTE, 0
        reusable = min(request.parent_prefix_tokens, parent.tokens, request.prompt_tokens - 1)
        reusable -= reusable % self._block
        if reusable <= 0:
            return KvSource.RECOMPUTE, 0
        return (KvSource.HBM if parent.location is KvLocation.HBM else KvSource.HOST), reusable

    def needed_bytes(self, request: CallRequest) -> float:
        """KV bytes of prompt + max output, less what the session holds in HBM already."""
        _, _, entry = self.reuse(request)
        total = self._cost.kv_bytes(request.prompt_tokens + request.max_output_tokens)
        held = entry.nbytes if entry is not None and entry.location is KvLocation.HBM else 0.0
        return max(0.0, total - held)

    def evict_for(self, need: float, *keep: str | None) -> float | None:
        """Free HBM for ``need`` bytes by evicting idle KV in ``NodeMemory.evictable`` order
        (never that of the sessions in ``keep``: the call's own and a child's parent's);
        returns the bytes offloaded to host (a PCIe transfer the caller waits for), or None if
        it cannot fit."""
        short = need - self._memory.hbm_free_bytes()
        victims = self._memory.take_evictable(KvLocation.HBM, short, keep)
        if sum(v.nbytes for v in victims) < short:
            return None
        offloaded = 0.0
        for victim in victims:
            if self._memory.hbm_free_bytes() >= need:
                break
            if self._host_kv and self._make_host_room(victim.nbytes):
                self._memory.move(victim.session_key, KvLocation.HOST)
                offloaded += victim.nbytes
            else:
                self._memory.drop(victim.session_key)
        return offloaded

    def _make_host_room(self, nbytes: float) -> bool:
        """Drop host KV (``NodeMemory.evictable`` order) until ``nbytes`` fit there (False if
        never)."""
        if nbytes > self._memory.host_kv_capacity_bytes:
            return False
        short = nbytes - self._memory.host_free_bytes()
        for old in self._memory.take_evictable(KvLocation.HOST, short):
            if self._memory.host_free_bytes() >= nbytes:
                break
            self._memory.drop(old.session_key)
        return self._memory.host_free_bytes() >= nbytes

    def commit(
        self, request: CallRequest, entry: SessionKv | None, now: float, others_running: bool
    ) -> None:
        """Hold prompt + max output tokens of KV in HBM for the admitted call (pinned while it
        runs); ``entry``: the session's entry ``reuse`` found. With ``others_running`` (another
        call of the session runs on this engine) the entry keeps what that call holds:
        tokens = max(entry's, prompt + max output), so the growth is ``needed_bytes``; the
        session's two calls share one entry, and shrinking it under the running one would
        let memory be committed twice (``CapacityError`` at that call's end)."""
        total_tokens = request.prompt_tokens + request.max_output_tokens
        if others_running and entry is not None:
            total_tokens = max(total_tokens, entry.tokens)
        pins = entry.pins if entry is not None else 0
        self._memory.put(
            SessionKv(
                request.session_key,
                self._model,
                total_tokens,
                self._cost.kv_bytes(total_tokens),
                KvLocation.HBM,
                now,
                pins + 1,
                request.priority.rank if self._class_eviction else SessionKv.rank,
            )
        )

    def release(
        self, request: CallRequest, output_tokens: int, now: float, others_running: bool
    ) -> None:
        """The call finished: its session keeps prompt + output tokens, unpinned by it; with
        ``others_running`` (another call of the session still runs on this engine) the entry
        keeps its size, which that call's commitment is part of (``commit``)."""
        if not others_running:
            tokens = request.prompt_tokens + output_tokens
            self._memory.resize(request.session_key, tokens, self._cost.kv_bytes(tokens))
        entry = self._memory.kv[request.session_key]
        entry.pins -= 1
        entry.last_used_s = now

    def put_away(self, keep_kv_on_host: bool) -> float:
        """The model goes to sleep: its sessions' HBM KV moves to host DRAM (most recent first,
        while room lasts) or is dropped. Returns the bytes moved (a PCIe transfer)."""
        mine = [
            e
            for e in self._memory.kv.values()
            if e.model == self._model and e.location is KvLocation.HBM
        ]
        mine.sort(key=lambda e: (-e.last_used_s, e.session_key))
        moved = 0.0
        for entry in mine:
            if keep_kv_on_host and self._make_host_room(entry.nbytes):
                self._memory.move(entry.session_key, KvLocation.HOST)
                moved += entry.nbytes
            else:
                self._memory.drop(entry.session_key)
        return moved
