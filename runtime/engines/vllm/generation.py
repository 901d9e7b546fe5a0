"""What a ``VLLMEngine``'s two ways of generating a call share (generate.py: as token ids;
chat_generate.py: through vLLM's chat serving layer): the engine's parts they use, and the
result of a finished call, whose prompt and output ids become the session's KV record
(kv.py)."""

from __future__ import annotations

import itertools

from talaria.core.calls import ModelOutput
from talaria.core.clock import Clock
from talaria.core.types import EngineTimes, Finished, KvSource
from talaria.runtime.engine import Admission, call_result
from talaria.runtime.engines.class_holds import ClassHolds
from talaria.runtime.engines.timing import BusyMeter
from talaria.runtime.engines.tokenizer import Tokenizer
from talaria.runtime.engines.vllm.adapter import VllmApi
from talaria.runtime.engines.vllm.kv import KvShape, SessionMemory
from talaria.runtime.engines.vllm.options import VLLMEngineOptions
from talaria.runtime.engines.vllm.prompts import PromptIds
from talaria.runtime.engines.vllm.switching import SleepStates


class VllmGeneration:
    """One model's generation on its ``AsyncLLM``: the engine's parts a call uses; each
    finished call's prompt and output ids become its session's KV record in ``memory`` (at the
    current sleep epoch of ``states``)."""

    def __init__(
        self,
        model: str,
        clock: Clock,
        node: str,
        api: VllmApi,
        tokenizer: Tokenizer,
        options: VLLMEngineOptions,
        memory: SessionMemory,
        states: SleepStates,
        prompts: PromptIds,
        busy: BusyMeter,
        holds: ClassHolds,
    ) -> None:
        self._model = model
        self._clock = clock
        self._node = node
        self._api = api
        self._tok = tokenizer
        self._opt = options
        self._memory = memory
        self._states = states
        self._prompts = prompts
        self._busy = busy
        self._holds = holds
        self._ids = itertools.count()

    def _finished(
        self,
        admission: Admission,
        kv: KvShape,
        ids: list[int],
        out_ids: list[int],
        cached: int,
        source: KvSource,
        first_s: float,
        output: ModelOutput,
        *,
        prompt_tokens: int | None = None,
        output_tokens: int | None = None,
        engine: EngineTimes | None = None,
    ) -> Finished:
        """The call's result; its prompt and output ids become the session's KV record.
        Token counts default to the ids' lengths (vLLM's own counts when it reports them);
        ``engine``: vLLM's own timestamps of the call, where it gave them."""
        request = admission.request
        recomputed = self._memory.recomputed(request, ids) if source is KvSource.RECOMPUTE else 0
        self._memory.remember(request.session_key, ids + out_ids, self._states.epoch)
        return Finished(
            call_result(
                admission,
                self._node,
                prompt_tokens=prompt_tokens or len(ids),
                cached_tokens=cached,
                output_tokens=output_tokens or len(out_ids),
                first_token_s=first_s,
                finished_s=self._clock.now(),
                kv_source=source,
                restored_bytes=kv.kv_bytes(cached) if source is KvSource.HOST else 0.0,
                recomputed_tokens=recomputed,
                output=output,
                engine=engine,
            )
        )
