"""How an upstream server is switched out and in, through its own HTTP endpoints.

- ``vllm``: ``vllm serve`` with ``VLLM_SERVER_DEV_MODE=1``: ``POST /sleep?level=1`` (weights
  to host memory, KV discarded), ``POST /wake_up`` (everything), ``POST /wake_up?tags=weights``
  then ``?tags=kv_cache`` (staging: weights first, ahead of the switch), ``GET /is_sleeping``
  (read once at start).
- ``sglang``: ``POST /release_memory_occupation`` and ``POST /resume_memory_occupation``
  (JSON body ``{}``); no staging, no state query.
- ``none``: nothing is called; the server keeps its memory and the node only gates its calls.

Every call is serialised (one at a time per server); ``epoch`` counts the sleeps, after which
the server's prefix cache is known to be empty.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

from talaria.runtime.engines.upstream.client import UpstreamClient
from talaria.runtime.engines.upstream.options import SleepKind
from talaria.runtime.engines.upstream.reading import UpstreamUnavailable


class SleepControl:
    """One server's sleep state and the calls that change it."""

    def __init__(self, kind: SleepKind, client: UpstreamClient) -> None:
        self.kind = kind
        self._client = client
        self._lock = asyncio.Lock()
        self.asleep = False
        """Whether the server sleeps (its memory released) as far as the engine knows."""
        self.weights_awake = True
        """vLLM only: the weights are on the device (after a staging wake, before the KV)."""
        self.epoch = 0
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def switches(self) -> bool:
        """Whether this server has sleep endpoints (``sleep`` is not ``none``)."""
        return self.kind != "none"

    async def put_to_sleep_at_start(self) -> None:
        """Right after start: sleep, so the node's picture (not active = asleep) is the
        server's. vLLM: only if ``GET /is_sleeping`` says it is awake. SGLang: release (an
        already released server may refuse; that refusal is ignored)."""
        if self.kind == "vllm":
            doc = await self._client.request("GET", "/is_sleeping", root=True)
            sleeping = bool(doc.get("is_sleeping")) if isinstance(doc, dict) else False
            if not sleeping:
                await self.sleep()
            self.asleep, self.weights_awake = True, False
        elif self.kind == "sglang":
            with contextlib.suppress(UpstreamUnavailable):
                await self.sleep()
            self.asleep, self.weights_awake = True, False

    async def sleep(self) -> None:
        """Release the server's memory (``/sleep?level=1`` or ``/release_memory_occupation``)."""
        if not self.switches:
            return
        async with self._lock:
            if self.kind == "vllm":
                await self._client.request("POST", "/sleep", params={"level": "1"}, root=True)
            else:
                await self._client.request("POST", "/release_memory_occupation", body={}, root=True)
            self.asleep, self.weights_awake = True, False
            self.epoch += 1

    async def wake(self) -> None:
        """Bring the server back: vLLM's ``/wake_up`` (only ``?tags=kv_cache`` if the weights
        were staged), SGLang's ``/resume_memory_occupation``."""
        if not self.switches:
            return
        async with self._lock:
            if not self.asleep:
                return
            if self.kind == "sglang":
                await self._client.request("POST", "/resume_memory_occupation", body={}, root=True)
            elif self.weights_awake:
                await self._client.request(
                    "POST", "/wake_up", params={"tags": "kv_cache"}, root=True
                )
            else:
                await self._client.request("POST", "/wake_up", root=True)
            self.asleep, self.weights_awake = False, True

    async def stage(self) -> None:
        """vLLM only: wake the weights (``/wake_up?tags=weights``) ahead of the switch."""
        async with self._lock:
            if self.asleep and not self.weights_awake:
                await self._client.request(
                    "POST", "/wake_up", params={"tags": "weights"}, root=True
                )
                self.weights_awake = True

    async def unstage(self) -> None:
        """vLLM only: staging cancelled while asleep: the woken weights go back to sleep."""
        if self.asleep and self.weights_awake:
            await self.sleep()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a staging step in the background (its failure only logs: activate retries)."""
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(_quiet(coro))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        """Cancel the background steps (the engine is shutting down)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def _quiet(coro: Coroutine[Any, Any, None]) -> None:
    with contextlib.suppress(UpstreamUnavailable):
        await coro
