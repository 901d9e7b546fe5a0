"""How a ``VLLMEngine`` serves a chat call through vLLM's serving layer (chat.py): its deltas
as vLLM streams them, paused and resumed for a higher class where its text can be continued
(fair queue rule 5, class_holds.py). The token-id path is generate.py's."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from talaria.core.calls import Call, FinishReason, OutputAccumulator
from talaria.core.types import CallRejected, CallRequest, FirstToken, GenerationEvent, TokenDelta
from talaria.runtime.engine import Admission
from talaria.runtime.engines.openai_wire import ChatTotals
from talaria.runtime.engines.priorities import vllm_priority
from talaria.runtime.engines.vllm.adapter import aclose, engine_times
from talaria.runtime.engines.vllm.chat import VllmChat, resumable, resume_body, to_vllm_request
from talaria.runtime.engines.vllm.generation import VllmGeneration
from talaria.runtime.engines.vllm.kv import KvShape


def _finish(reason: str) -> FinishReason:
    if reason == "tool_calls":
        return "tool_calls"
    return "length" if reason == "length" else "stop"


def _context_error(exc: CallRejected) -> CallRejected:
    """vLLM's "maximum context length" refusal as OpenAI's ``context_length_exceeded``."""
    if "context length" in str(exc).lower():
        return CallRejected("context_length_exceeded", str(exc), "messages")
    return exc


class ChatGeneration(VllmGeneration):
    """The chat path of a model's generation (``chat``)."""

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
