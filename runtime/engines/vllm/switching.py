"""The GPU path's sleep / wake state machine of one engine (vLLM sleep mode).

vLLM holds two things on the device that sleep mode can release and restore: the ``weights``
and the ``kv_cache``. The engine wants one of three states — active (both awake), staged
(weights awake ahead of a switch; vLLM stays paused until ``kv_cache`` is woken too), or asleep
— and ``converge`` brings vLLM there with serialised calls: ``wake_up()`` for what is missing
(all of it at once: waking only the weights leaves vLLM paused, the pitfall of
docs/sources.md §5), or ``sleep(level)`` when something awake is not wanted, KV discarded either
way (``epoch`` counts those sleeps, so KV from an earlier epoch is known to be gone from the
device):

- **level 1** copies the weights to pinned host memory, and ``wake_up`` copies them back;
- **level 2** discards them (host memory keeps only the model's buffers): the engine stays
  initialised, and a wake reallocates the weights (``wake_up(tags=["weights"])``), reloads them
  from the model's files (``collective_rpc("reload_weights")``), then wakes the KV pool — the
  sequence vLLM documents for level 2 (docs/sources.md §16). For a node whose host DRAM cannot
  hold every model's copy: its wake reads the checkpoint (NVMe, core/weight_tiers.py) instead.

Staging needs the weights to fit in free device memory now: ``free_device_bytes`` (asked at
most once per ``PROBE_INTERVAL_S``) ≥ ``weight_bytes_per_device``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from talaria.core.clock import Clock
from talaria.runtime.engines.vllm.adapter import AsyncLLMLike

WEIGHTS = "weights"
KV_CACHE = "kv_cache"
ALL_TAGS = frozenset({WEIGHTS, KV_CACHE})
PROBE_INTERVAL_S = 1.0
"""How long a free-device-memory reading stays good for staging decisions."""


class SleepStates:
    """What of one engine's ``AsyncLLM`` is awake (``awake``), what the engine wants awake
    (active, staged or asleep), and the serialised sleep / wake calls between them."""

    def __init__(
        self,
        clock: Clock,
        *,
        weight_bytes_per_device: float | None,
        free_device_bytes: Callable[[], float] | None,
        level: int = 1,
    ) -> None:
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, not {level}")
        self._clock = clock
        self.level = level
        """vLLM's sleep level at every sleep (the module docstring)."""
        self._weights = weight_bytes_per_device
        self._probe = free_device_bytes
        self._ctl = asyncio.Lock()
        self.awake: frozenset[str] = ALL_TAGS
        """What vLLM holds on the device now: ``weights`` and/or ``kv_cache``."""
        self.want_active = False
        self.want_staged = False
        self.epoch = 0
        """Sleeps so far: KV in the device prefix cache is from the current epoch only."""
        self.reloads = 0
        """Weight reloads from the model's files (level 2 wakes)."""
        self._discarded = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._probe_at: float | None = None
        self._probe_free = 0.0

    @property
    def staged(self) -> bool:
        """Staging is wanted (the weights may still be on their way)."""
        return self.want_staged

    async def put_to_sleep_after_start(self, llm: AsyncLLMLike) -> None:
        """Right after the engine starts: sleep, so the next engine's start finds the memory
        free."""
        await self._sleep(llm)

    async def activate(self, llm: AsyncLLMLike) -> None:
        """Wake whatever is asleep (weights and KV cache)."""
        self.want_active = True
        self.want_staged = False
        await self.converge(llm)

    async def deactivate(self, llm: AsyncLLMLike) -> None:
        """Put everything awake to sleep (``sleep(level)``)."""
        self.want_active = False
        self.want_staged = False
        await self.converge(llm)

    def start_staging(self, llm: AsyncLLMLike) -> bool:
        """Wake the weights ahead of the switch (in the background) if they fit now."""
        if self.want_staged or self._weights is None or self._free() < self._weights:
            return False
        self.want_staged = True
        self._spawn(self.converge(llm))
        return True

    def cancel_staging(self, llm: AsyncLLMLike, active: bool) -> None:
        """Stop staging; weights already woken go back to sleep (in the background)."""
        if not self.want_staged:
            return
        self.want_staged = False
        if not active:
            self._spawn(self.converge(llm))

    async def stop(self) -> None:
        """Cancel the background convergences (the engine is shutting down)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _free(self) -> float:
        if self._probe is None:
            return 0.0
        now = self._clock.now()
        if self._probe_at is None or now - self._probe_at >= PROBE_INTERVAL_S:
            self._probe_at, self._probe_free = now, self._probe()
        return self._probe_free

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _wanted(self) -> frozenset[str]:
        if self.want_active:
            return ALL_TAGS
        if self.want_staged:
            return frozenset({WEIGHTS})
        return frozenset()

    async def converge(self, llm: AsyncLLMLike) -> None:
        """Bring vLLM to the wanted state, one serialised call at a time."""
        async with self._ctl:
            for _ in range(4):
                want = self._wanted()
                have = self.awake
                if want == have:
                    return
                if have <= want:
                    await self._wake(llm, want - have)
                    self.awake = want
                else:
                    await self._sleep(llm)
                    self.epoch += 1

    async def _sleep(self, llm: AsyncLLMLike) -> None:
        await llm.sleep(level=self.level)
        self.awake = frozenset()
        self._discarded = self.level == 2

    async def _wake(self, llm: AsyncLLMLike, missing: frozenset[str]) -> None:
        """Wake ``missing``: at once while the weights wait in host memory; after a level-2
        sleep the weights first, reloaded from the model's files, then the KV pool."""
        if WEIGHTS in missing and self._discarded:
            await llm.wake_up(tags=[WEIGHTS])
            await llm.collective_rpc("reload_weights")
            self._discarded = False
            self.reloads += 1
            missing = missing - {WEIGHTS}
            if missing:
                await llm.wake_up(tags=sorted(missing))
        elif missing == ALL_TAGS:
            await llm.wake_up()
        else:
            await llm.wake_up(tags=sorted(missing))
