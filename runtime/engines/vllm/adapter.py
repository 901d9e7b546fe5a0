"""The boundary with vLLM: the part of ``AsyncLLM`` the engine uses, and the builders of
vLLM's request objects (imported on first use, so this package imports without vLLM; tests
pass fakes)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

from talaria.core.types import EngineTimes


class AsyncLLMLike(Protocol):
    """The part of ``vllm.v1.engine.async_llm.AsyncLLM`` the engine uses."""

    def generate(
        self, prompt: Any, sampling_params: Any, request_id: str, *, priority: int = 0
    ) -> AsyncIterator[Any]: ...

    async def sleep(self, level: int = 1) -> None: ...

    async def wake_up(self, tags: list[str] | None = None) -> Any: ...

    async def collective_rpc(self, method: str) -> Any:
        """Run ``method`` on every worker (``"reload_weights"`` after a level-2 sleep)."""
        ...

    async def abort(self, request_id: str) -> None: ...

    def shutdown(self) -> None: ...


class VllmApi(Protocol):
    """Builds vLLM's request objects (a fake in tests)."""

    def tokens_prompt(self, ids: list[int]) -> Any: ...

    def sampling_params(self, *, max_tokens: int, ignore_eos: bool, **extra: Any) -> Any: ...

    def engine_now(self) -> float:
        """Now on the clock vLLM's EngineCore stamps its outputs with."""
        ...


class RealVllmApi:
    """``TokensPrompt`` and ``SamplingParams`` from vLLM (imported on first use). Outputs come
    as deltas (``RequestOutputKind.DELTA``) and are not detokenized by vLLM
    (``detokenize=False``): the engine decodes with its own tokenizer."""

    def tokens_prompt(self, ids: list[int]) -> Any:
        from vllm.inputs import TokensPrompt

        return TokensPrompt(prompt_token_ids=ids)

    def sampling_params(self, *, max_tokens: int, ignore_eos: bool, **extra: Any) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            max_tokens=max_tokens,
            ignore_eos=ignore_eos,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
            **extra,
        )

    def engine_now(self) -> float:
        """``time.monotonic()``: vLLM stamps ``EngineCoreOutputs`` and its request events with
        it, in the EngineCore process; on one machine every process reads the same clock."""
        return time.monotonic()


def engine_times(metrics: Any, engine_now: float, clock_now: float) -> EngineTimes | None:
    """vLLM's per-request ``RequestStateStats`` (``RequestOutput.metrics``, kept while vLLM logs
    stats, its default) as ``EngineTimes`` on the runtime's clock: t = clock_now − (engine_now −
    t_engine), both clocks read together and running at one rate. None while any of the four
    timestamps is unset (0) or the engine keeps no stats."""
    if metrics is None:
        return None
    stamps = [
        getattr(metrics, name, 0.0)
        for name in ("queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts")
    ]
    if not all(isinstance(t, float) and t > 0 for t in stamps):
        return None
    queued, scheduled, first, last = (clock_now - (engine_now - t) for t in stamps)
    return EngineTimes(queued, scheduled, first, last)


def sleep_mode_available() -> bool:
    """Whether vLLM's current platform has sleep mode (CUDA / ROCm / XPU); False without vLLM
    and on the CPU backend."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    return bool(current_platform.is_sleep_mode_available())


def config_int(llm: Any, section: str, name: str) -> int | None:
    """``llm.vllm_config.<section>.<name>`` if it is a positive int (None for an engine without
    that config, e.g. a test fake)."""
    value = getattr(getattr(getattr(llm, "vllm_config", None), section, None), name, None)
    return value if isinstance(value, int) and value > 0 else None


async def aclose(stream: AsyncIterator[Any]) -> None:
    """Close vLLM's output stream early (vLLM aborts the request when it is closed)."""
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()


def no_shutdown(*args: Any, **kwargs: Any) -> None:
    """Stands in for ``shutdown`` on an ``AsyncLLM`` already shut down."""
