"""How a ``VLLMEngine`` serves an admitted call: its generation on the ``AsyncLLM`` (as token
ids, from its prompt ids: prompts.py; or as a chat call through vLLM's serving layer, chat.py),
and its result, whose prompt and output ids become the session's KV record (kv.py)."""

from __future__ import annotations

import itertools
from collections.abc import AsyncGenerator
from typing import Any

from talaria.core.calls import (
    DEFAULT_SAMPLING,
    Call,
    FinishReason,
    ModelOutput,
    OutputAccumulator,
    OutputDelta,
)
from talaria.core.clock import Clock
from talaria.core.types import (
    CallRejected,
    CallRequest,
    EngineTimes,
    Finished,
    FirstToken,
    GenerationEvent,
    KvSource,
    TokenDelta,
)
from talaria.runtime.engine import Admission, call_result
from talaria.runtime.engines.class_holds import ClassHolds
from talaria.runtime.engines.openai_wire import ChatTotals, decoding_params
from talaria.runtime.engines.priorities import vllm_priority
from talaria.runtime.engines.timing import BusyMeter
from talaria.runtime.engines.tokenizer import IncrementalDecoder, Tokenizer
from talaria.runtime.engines.vllm.adapter import (
    AsyncLLMLike,
    VllmApi,
    aclose,
    engine_times,
)
from talaria.runtime.engines.vllm.chat import VllmChat, resumable, resume_body, to_vllm_request
from talaria.runtime.engines.vllm.kv import KvShape, SessionMemory
from talaria.runtime.engines.vllm.options import VLLMEngineOptions
from talaria.runtime.engines.vllm.prompts import PromptIds
from talaria.runtime.engines.vllm.switching import SleepStates


def _finish(reason: str) -> FinishReason:
    if reason == "tool_calls":
        return "tool_calls"
    return "length" if reason == "length" else "stop"


def _context_error(exc: CallRejected) -> CallRejected:
    """vLLM's "maximum context length" refusal as OpenAI's ``context_length_exceeded``."""
    if "context length" in str(exc).lower():
        return CallRejected("context_length_exceeded", str(exc), "messages")
    return exc


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


class VllmGenerator:
    """Generates one model's admitted calls on its ``AsyncLLM`` (as token ids, ``tokens``, or
    through vLLM's chat serving layer, ``chat``); each finished call's prompt and output ids
    become its session's KV record in ``memory`` (at the current sleep epoch of ``states``)."""

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

    async def chat(
        self, admission: Admission, call: Call, chat: VllmChat, kv: KvShape
    ) -> AsyncGenerator[GenerationEvent, None]:
        """A chat call through vLLM's serving layer (chat.py): its deltas as vLLM streams
        them; the prompt ids and cached tokens it reports go to the session's KV record. It
        takes part in the engine's holds (fair queue rule 5, class_holds.py): held before it
        starts, it waits; once it streams, a call whose text can be continued (chat.py
        ``resumable``) pauses when held — aborted in vLLM at a visible character, then resumed
        as its messages plus its text so far, which vLLM continues (``resume_body``), once vLLM
        has rendered that body and its window holds every token left (``resume_room``) — and
        any other call runs on (it counts as past its preemption limit)."""
        request = admission.request
        limit = self._chat_limit(request, call)
        original = body = to_vllm_request(
            call,
            model=self._model,
            request_id=f"{request.request_id}#{next(self._ids)}",
            priority=vllm_priority(request.priority, admission.sp_admitted),
            max_tokens=limit,
            cache_salt=request.cache_salt,
        )
        self._prompts.forget(request.request_id)
        chat_options = self._opt.chat
        can_pause = resumable(call, chat_options.reasoning_parser if chat_options else None)
        first: ChatTotals | None = None  # the first piece's: its prompt ids and cached tokens
        completion = 0
        output = OutputAccumulator()
        texts: list[str] = []
        out_ids: list[int] = []
        first_s: float | None = None
        finish: FinishReason = "stop"
        metrics: Any = None
        ticket = self._holds.enter(request.priority.rank, request.prompt_tokens)
        self._busy.begin()
        try:
            paused, finished = True, False
            while paused and not finished:
                await ticket.released.wait()
                paused = False
                ticket.pausable = can_pause
                if first is not None:  # a piece ran and paused: go on from its text
                    left = limit - len(out_ids)
                    body = resume_body(
                        original, "".join(texts), left, f"{request.request_id}#{next(self._ids)}"
                    )
                try:
                    vllm_request = chat.request(body)
                except CallRejected as exc:
                    raise _context_error(exc) from exc
                piece, piece_ids = ChatTotals(), 0
                stream = chat.stream(vllm_request, piece)
                try:
                    async for chunk in stream:
                        if chunk.finish_reason is not None:
                            finish, finished = _finish(chunk.finish_reason), True
                        if not chunk.token_ids and chunk.delta.empty:
                            continue
                        now = self._clock.now()
                        out_ids.extend(chunk.token_ids)
                        piece_ids += len(chunk.token_ids)
                        output.add(chunk.delta)
                        texts.append(chunk.delta.text)
                        ticket.context_tokens = request.prompt_tokens + len(out_ids)
                        if first_s is None:
                            first_s = now
                            cached, source = admission.cached_tokens, admission.kv_source
                            yield FirstToken(now, cached, source, chunk.delta)
                        elif request.stream:
                            yield TokenDelta(now, len(chunk.token_ids), chunk.delta)
                        text = chunk.delta.text
                        visible_end = bool(text) and not text[-1].isspace()
                        if can_pause and ticket.held and not finished and visible_end:
                            room = await chat.resume_room(
                                original, "".join(texts), self._opt.max_model_len
                            )
                            if room is None or room < limit - len(out_ids):
                                ticket.pausable = False  # it could not be resumed whole: it runs on
                                self._holds.decide()
                            elif ticket.held:  # abort now, resume when released
                                paused = True
                                break
                except CallRejected as exc:
                    raise _context_error(exc) from exc
                finally:
                    if paused:
                        await aclose(stream)  # chat.stream aborts the request in vLLM
                first = first or piece
                completion += piece.completion_tokens or piece_ids
                if not paused:
                    metrics = chat.metrics_of(vllm_request)
                elif len(out_ids) >= limit:
                    finished, finish = True, "length"
        finally:
            self._busy.end()
            self._holds.leave(ticket)
        if first is None or first_s is None:
            raise RuntimeError(f"{self._model}: request {request.request_id} ended without output")
        ids = first.prompt_token_ids
        cached = first.cached_tokens if first.completion_tokens else admission.cached_tokens
        yield self._finished(
            admission,
            kv,
            ids,
            out_ids,
            cached,
            self._memory.classify(request, cached, self._states.epoch),
            first_s,
            output.output(finish),
            prompt_tokens=first.prompt_tokens,
            output_tokens=completion,
            engine=engine_times(metrics, self._api.engine_now(), self._clock.now()),
        )

    def _chat_limit(self, request: CallRequest, call: Call) -> int:
        """The chat call's output limit: its own, or, when the client set none (the proxy's
        default applies), at most what the window leaves after the prompt as this engine's
        tokenizer renders it with the template vLLM serves (``PromptIds``): ``vllm serve``'s
        rule for a request without ``max_tokens``. A prompt that fills the window is the
        client's error; one that cannot be rendered here is left to vLLM to judge."""
        limit = request.output_tokens or request.max_output_tokens
        if call.max_output_tokens is not None or request.output_tokens is not None:
            return limit
        try:
            prompt = len(self._prompts.get(request))
        except Exception:  # vLLM renders it next and says what is wrong
            return limit
        room = self._opt.max_model_len - prompt
        if room < 1:
            raise CallRejected(
                "context_length_exceeded",
                f"This model's maximum context length is {self._opt.max_model_len} tokens. "
                f"However, your messages resulted in {prompt} tokens ({self._model}).",
                param="messages",
            )
        return min(limit, room)

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
