"""A chat call rendered, sampled and parsed by vLLM's own OpenAI serving layer.

``OpenAIServingChat`` is what ``vllm serve`` runs behind ``/v1/chat/completions``. Per model
family it renders the prompt with the model's chat template (tools and template kwargs
included), converts the sampling parameters (``ChatCompletionRequest.to_sampling_params``),
constrains the output with structured outputs (``response_format``; the tool-call envelope for
a ``required`` or named ``tool_choice``, and a tool's arguments when the tool is ``strict`` or
the engine's ``tool_strict_level`` is ``parameter``), generates, and parses tool calls and
reasoning out of the model's text with the tool-call and reasoning parsers the node config
names, streaming deltas. The engine builds one over its own ``AsyncLLM`` (``VllmChat.build``),
turns each call's ``Call`` into vLLM's ``ChatCompletionRequest`` (``to_vllm_request``) and reads
the server-sent chunks back as ``ChatEvent``s. Nothing here parses model text.

Calls always stream inside (so the first token's time is known, and KV bookkeeping sees the
token ids vLLM returns with ``return_token_ids``); a caller that did not ask for a stream gets
the deltas folded, which is what a streaming client of ``vllm serve`` would get. The OpenAI
fields and chunks themselves are runtime/engines/openai_wire.py's, which the upstream engine
shares.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from talaria.core.calls import Call
from talaria.core.types import CallRejected
from talaria.runtime.engines.openai_wire import (
    ChatChunk,
    ChatTotals,
    chat_fields,
    parse_chunk,
    rejected,
    wire_error,
)


def to_vllm_request(
    call: Call,
    *,
    model: str,
    request_id: str,
    priority: int,
    max_tokens: int,
    cache_salt: str | None,
) -> dict[str, Any]:
    """The body of vLLM's ``ChatCompletionRequest`` for ``call``: ``chat_fields`` with vLLM's
    own (the limit, the priority, the request id, token ids, the tenant's cache salt)."""
    body: dict[str, Any] = {
        "model": model,
        **chat_fields(call),
        "max_completion_tokens": max_tokens,
        "priority": priority,
        "request_id": request_id,
        "return_token_ids": True,
    }
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    return body


def resumable(call: Call, reasoning_parser: str | None) -> bool:
    """Whether a chat call, once it streams, can be paused and continued from its text alone
    (``resume_body``): plain text, nothing that reads the output as a whole — no tools it may
    call, no ``response_format`` grammar, no ``stop`` string (one could span the cut), and no
    reasoning parser on the engine (its state at the cut is not in the text)."""
    calls_tools = bool(call.tools) and call.tool_choice.mode != "none"
    return not (
        calls_tools or call.sampling.response_format or call.sampling.stop or reasoning_parser
    )


def resume_body(
    body: Mapping[str, Any], text: str, max_tokens: int, request_id: str
) -> dict[str, Any]:
    """The body that continues a paused chat call: its messages plus its text so far as the
    assistant's final message, which vLLM's chat template leaves open
    (``continue_final_message``, no generation prompt), for the tokens it has left, under a new
    request id. The template strips the final message's trailing whitespace, so ``text`` must
    end in a visible character (the caller pauses only there)."""
    return {
        **body,
        "messages": [*body["messages"], {"role": "assistant", "content": text}],
        "continue_final_message": True,
        "add_generation_prompt": False,
        "max_completion_tokens": max_tokens,
        "request_id": request_id,
    }


class MeteredClient:
    """The engine client vLLM's serving layer calls: the ``AsyncLLM`` itself, except that
    ``generate`` keeps each request's latest ``RequestOutput.metrics`` (vLLM's own timestamps,
    adapter.py ``engine_times``), which the chat layer's chunks do not carry."""

    def __init__(self, llm: Any) -> None:
        self._llm = llm
        self.metrics: dict[str, Any] = {}

    def generate(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        """``AsyncLLM.generate``, metered."""
        return self._metered(self._llm.generate(*args, **kwargs))

    async def _metered(self, outputs: Any) -> AsyncIterator[Any]:
        try:
            async for out in outputs:
                metrics = getattr(out, "metrics", None)
                if metrics is not None:
                    self.metrics[str(getattr(out, "request_id", ""))] = metrics
                yield out
        finally:
            with contextlib.suppress(Exception):
                await outputs.aclose()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llm, name)


class VllmChat:
    """vLLM's chat serving layer over one engine (see the module docstring)."""

    def __init__(
        self, serving: Any, model: str, llm: Any = None, special_tokens: Sequence[str] = ()
    ) -> None:
        self._serving = serving
        self._llm = llm
        self.model = model
        self._special = tuple(t for t in special_tokens if t)
        self._metered: MeteredClient | None = None
        if llm is not None and getattr(serving, "engine_client", None) is llm:
            self._metered = MeteredClient(llm)
            serving.engine_client = self._metered

    def metrics_of(self, request: Any) -> Any:
        """vLLM's stats of the request (None if it kept none), forgotten once read."""
        if self._metered is None:
            return None
        return self._metered.metrics.pop(f"chatcmpl-{request.request_id}", None)

    @classmethod
    async def build(
        cls,
        llm: Any,
        model: str,
        model_path: str,
        *,
        tool_parser: str | None,
        reasoning_parser: str | None,
        tool_strict_level: str = "parameter",
        chat_template: str | None = None,
        special_tokens: Sequence[str] = (),
    ) -> VllmChat:
        """The serving objects ``vllm serve`` builds (``init_app_state``), for this engine:
        auto tool choice on with ``tool_parser``, ``reasoning_parser``, cached-token details
        and usage in every stream; ``special_tokens`` never reach the reply's text."""
        from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
        from vllm.entrypoints.openai.models.protocol import BaseModelPath
        from vllm.entrypoints.openai.models.serving import OpenAIServingModels
        from vllm.renderers.chat_utils import load_chat_template
        from vllm.renderers.online_renderer import OnlineRenderer

        template = load_chat_template(chat_template)
        models = OpenAIServingModels(
            engine_client=llm, base_model_paths=[BaseModelPath(name=model, model_path=model_path)]
        )
        await models.init_static_loras()
        common: dict[str, Any] = {
            "chat_template": template,
            "chat_template_content_format": "auto",
            "trust_request_chat_template": False,
            "enable_auto_tools": tool_parser is not None,
            "tool_parser": tool_parser,
            "tool_strict_level": tool_strict_level,
            "reasoning_parser": reasoning_parser or "",
            "default_chat_template_kwargs": None,
        }
        renderer = OnlineRenderer(
            model_config=llm.model_config,
            renderer=llm.renderer,
            request_logger=None,
            trust_request_mm_kwargs=False,
            exclude_tools_when_tool_choice_none=False,
            log_error_stack=False,
            **common,
        )
        serving = OpenAIServingChat(
            llm,
            models,
            "assistant",
            online_renderer=renderer,
            request_logger=None,
            enable_prompt_tokens_details=True,
            enable_force_include_usage=True,
            **{k: v for k, v in common.items() if k != "default_chat_template_kwargs"},
        )
        return cls(serving, model, llm, special_tokens)

    def request(self, body: Mapping[str, Any]) -> Any:
        """vLLM's ``ChatCompletionRequest``; its validation failures are the caller's fault."""
        from pydantic import ValidationError
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.exceptions import VLLMClientError

        try:
            return ChatCompletionRequest.model_validate(dict(body))
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first["loc"]) or None
            message = str(first.get("msg", exc)).removeprefix("Value error, ")
            raise CallRejected("invalid_value", message, param) from exc
        except VLLMClientError as exc:  # vLLM's own validators raise VLLMValidationError
            param = getattr(exc, "parameter", None)
            raise CallRejected(
                "invalid_value", str(exc), param if isinstance(param, str) else None
            ) from exc

    async def prompt_tokens(self, body: Mapping[str, Any]) -> int | None:
        """The prompt tokens of ``body`` as vLLM's serving layer renders it (its template, its
        tokenizer: what a request of that body would prefill), or None where vLLM cannot render
        it (e.g. a chat template that cannot continue a final assistant message)."""
        try:
            rendered = await self._serving.render_chat_request(self.request(body))
            _, inputs = rendered
            return int(self._serving._extract_prompt_len(inputs[0]))
        except Exception:  # any refusal: the body cannot be served as it is
            return None

    async def resume_room(
        self, body: Mapping[str, Any], text: str, max_model_len: int
    ) -> int | None:
        """The output tokens a chat call (``body``, as first sent) paused now could take when
        resumed from ``text``: the window less the resumed prompt as vLLM renders it (the text
        so far is tokenized anew, maybe into more tokens than were generated); None where
        vLLM cannot render it. A call is paused only where this leaves it every token it has
        left, so a pause never changes how a reply ends."""
        prompt = await self.prompt_tokens(resume_body(body, text, 1, "room"))
        return None if prompt is None else max_model_len - prompt

    async def stream(self, request: Any, totals: ChatTotals) -> AsyncIterator[ChatChunk]:
        """The call's chunks as vLLM's serving layer streams them. A request vLLM refuses as
        the client's fault (``VLLMClientError``, raised while it renders and checks the
        prompt: a prompt or output limit past the window, a bad parameter) is
        ``CallRejected``, a 400 in the client's dialect, never a runtime fault. Left before
        its end (the client went away, the call was cancelled), the generation is aborted in
        the engine at once, so that it stops using the engine and its KV blocks."""
        from vllm.exceptions import VLLMClientError

        try:
            result = await self._serving.create_chat_completion(request, None)
        except VLLMClientError as exc:
            raise rejected(str(exc), getattr(exc, "parameter", None)) from exc
        if not hasattr(result, "__aiter__"):
            error = json.loads(result.model_dump_json()).get("error", {})
            raise wire_error(error)
        done = False
        try:
            async for line in result:
                if not line.startswith("data: "):
                    continue
                payload = line[len("data: ") :].strip()
                if payload == "[DONE]":
                    done = True
                    break
                chunk = parse_chunk(json.loads(payload), totals)
                if chunk is not None:
                    yield self.clean(chunk)
        finally:
            if not done:
                await self._abort(result, request)
                self.metrics_of(request)

    def clean(self, chunk: ChatChunk) -> ChatChunk:
        """The chunk without the tokenizer's special tokens in its text (a special token is
        one token, so it is never split across chunks)."""
        text = chunk.delta.text
        if not self._special or not text:
            return chunk
        for token in self._special:
            text = text.replace(token, "")
        return replace(chunk, delta=replace(chunk.delta, text=text))

    async def _abort(self, result: Any, request: Any) -> None:
        """Close vLLM's stream and abort its request in the engine (vLLM's serving layer names
        it ``chatcmpl-<request_id>``; ``AsyncLLM.abort`` takes that external id)."""
        with contextlib.suppress(Exception):
            await result.aclose()
        if self._llm is not None:
            with contextlib.suppress(Exception):
                await self._llm.abort(f"chatcmpl-{request.request_id}")
