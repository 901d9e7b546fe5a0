"""How a ``VLLMEngine`` serves an admitted call on its ``AsyncLLM``: as token ids, from its
prompt ids (prompts.py), decoded here; or as a chat call through vLLM's serving layer
(chat_generate.py). What both share, the engine's parts and a finished call's result, is
generation.py's."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from talaria.core.calls import (
    DEFAULT_SAMPLING,
    Call,
    FinishReason,
    ModelOutput,
    OutputDelta,
)
from talaria.core.types import (
    CallRejected,
    CallRequest,
    FirstToken,
    GenerationEvent,
    TokenDelta,
)
from talaria.runtime.engine import Admission
from talaria.runtime.engines.openai_wire import decoding_params
from talaria.runtime.engines.priorities import vllm_priority
from talaria.runtime.engines.tokenizer import IncrementalDecoder
from talaria.runtime.engines.vllm.adapter import (
    AsyncLLMLike,
    aclose,
    engine_times,
)
from talaria.runtime.engines.vllm.chat_generate import ChatGeneration
from talaria.runtime.engines.vllm.kv import KvShape


def _token_sampling(request: CallRequest) -> dict[str, Any]:
    """The caller's sampling parameters that apply to a call sent as token ids (no stop strings
    or logprobs there: the engine decodes itself; chat calls get every parameter)."""
    return decoding_params(request.call.sampling if request.call is not None else DEFAULT_SAMPLING)


def refuse_what_tokens_cannot_honour(call: Call, model: str) -> None:
    """A call sent as token ids is generated as plain text: it cannot offer tools, force a tool
    call or hold the output to a format, so a call that asks for one is the client's error
    (``CallRejected``: a 400 that names the field), never silently answered in plain text.
    Such a model is one served without a Hugging Face tokenizer (the tiny test models)."""
    asked = [
        name
        for name, given in (
            ("tools", bool(call.tools) and call.tool_choice.mode != "none"),
            ("response_format", bool(call.sampling.response_format)),
        )
        if given
    ]
    if asked:
        raise CallRejected(
            "invalid_value",
            f"Model {model} cannot honour {' or '.join(repr(a) for a in asked)}: it is served "
            "without a chat template or tool-call parser (as token ids). Serve it with its "
            "Hugging Face tokenizer and a tool parser (docs/models.md), or leave these out.",
            param=asked[0],
        )


class VllmGenerator(ChatGeneration):
    """Generates one model's admitted calls on its ``AsyncLLM``: as token ids (``tokens``,
    here) or through vLLM's chat serving layer (``chat``, chat_generate.py)."""

    async def tokens(
        self, admission: Admission, llm: AsyncLLMLike, kv: KvShape
    ) -> AsyncGenerator[GenerationEvent, None]:
        """A call sent to ``llm`` as token ids, decoded here: ``FirstToken`` (with vLLM's
        cached-token count and the first token's text), ``TokenDelta``s for a streaming call,
        then ``Finished``. While the engine's ``holds`` hold it for a higher class (fair queue
        rule 5, class_holds.py) it is paused: aborted in vLLM, then resubmitted as its prompt
        plus its output so far with the tokens it has left, which vLLM's prefix cache finds
        again; one decoder runs across the pieces, so the text is whole."""
        request = admission.request
        call = request.call
        if call is not None:
            refuse_what_tokens_cannot_honour(call, self._model)
        ids = self._prompts.get(request)
        self._prompts.forget(request.request_id)
        room = self._opt.max_model_len - len(ids)
        if room < 1:
            raise CallRejected(
                "context_length_exceeded",
                f"This model's maximum context length is {self._opt.max_model_len} tokens. "
                f"However, your prompt is {len(ids)} tokens ({self._model}).",
                param="messages" if call is not None and call.messages is not None else "prompt",
            )
        known = request.output_tokens  # a replayed reply: exactly that many tokens
        limit = max(1, min(known or request.max_output_tokens, room))
        sampling = {**self._opt.sampling, **_token_sampling(request)}
        ignore_eos = self._opt.ignore_eos or known is not None
        priority = vllm_priority(request.priority, admission.sp_admitted)
        decoder = IncrementalDecoder(self._tok)
        out_ids: list[int] = []
        cached = 0
        first_s: float | None = None
        source = admission.kv_source
        finished = False
        finish_reason: FinishReason = "stop"
        metrics: Any = None
        ticket = self._holds.enter(request.priority.rank, len(ids))
        self._busy.begin()
        try:
            paused = True
            while paused and not finished:
                await ticket.released.wait()
                paused = False
                params = self._api.sampling_params(
                    max_tokens=limit - len(out_ids), ignore_eos=ignore_eos, **sampling
                )
                request_id = f"{request.request_id}#{next(self._ids)}"
                stream = llm.generate(
                    self._api.tokens_prompt(ids + out_ids), params, request_id=request_id,
                    priority=priority,
                )  # fmt: skip
                try:
                    async for out in stream:
                        num_cached = getattr(out, "num_cached_tokens", None)
                        if num_cached is not None and first_s is None:
                            cached = int(num_cached)
                        metrics = getattr(out, "metrics", None) or metrics
                        outputs = getattr(out, "outputs", None) or ()
                        new = [int(t) for t in outputs[0].token_ids] if outputs else []
                        finished = bool(getattr(out, "finished", False))
                        reason = getattr(outputs[0], "finish_reason", None) if outputs else None
                        if finished and reason == "length":
                            finish_reason = "length"
                        if not new and not finished:
                            continue
                        now = self._clock.now()
                        out_ids.extend(new)
                        ticket.context_tokens = len(ids) + len(out_ids)
                        rest = new
                        if first_s is None and new:
                            first_s = now
                            source = self._memory.classify(request, cached, self._states.epoch)
                            text = decoder.push(new[:1])
                            rest = new[1:]
                            if finished and not rest:
                                text += decoder.finish()
                            yield FirstToken(now, cached, source, OutputDelta(text=text))
                        if rest or (finished and first_s is not None):
                            text = decoder.push(rest) if rest else ""
                            if finished:
                                text += decoder.finish()
                            if request.stream and (rest or text):
                                yield TokenDelta(now, len(rest), OutputDelta(text=text))
                        if not finished and ticket.held:
                            paused = True  # for a higher class: abort, resubmit when released
                            break
                    # (no break at ``finished``: vLLM's stream then ends by itself)
                finally:
                    if not finished:
                        await aclose(stream)
                if paused and len(out_ids) >= limit:
                    finished, finish_reason = True, "length"
        finally:
            self._busy.end()
            self._holds.leave(ticket)
        if first_s is None:
            raise RuntimeError(f"{self._model}: request {request.request_id} ended without output")
        yield self._finished(
            admission,
            kv,
            ids,
            out_ids,
            cached,
            source,
            first_s,
            ModelOutput(text=decoder.text, finish_reason=finish_reason),
            engine=engine_times(metrics, self._api.engine_now(), self._clock.now()),
        )
