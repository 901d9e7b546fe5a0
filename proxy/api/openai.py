"""OpenAI-compatible routes: chat completions, completions, models, session hints and ends."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from talaria.proxy.api.context import ProxyContext, context, json_response, read_json
from talaria.proxy.api.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    HintRequest,
    parse,
)
from talaria.proxy.errors import ApiError, unknown_model
from talaria.proxy.gateway import CallHandle, CallOutcome, PreparedCall
from talaria.proxy.sessions import Identity, IdentityError, identify, message_fingerprint
from talaria.proxy.synthetic import MESSAGE_OVERHEAD_TOKENS, chunks_of, estimate_tokens, words

router = APIRouter()


async def _tenant(ctx: ProxyContext, request: Request) -> str:
    client = request.client.host if request.client else None
    return await ctx.auth.tenant(request.headers.get("authorization"), client)


def _identity(request: Request, body: dict[str, Any]) -> Identity:
    try:
        return identify(request.headers, body)
    except IdentityError as exc:
        raise ApiError(400, str(exc), param="headers", code="invalid_session") from exc


def _check_model(ctx: ProxyContext, model: str) -> None:
    if model not in ctx.gateway.models():
        raise unknown_model(model, ctx.gateway.models())


def _usage(outcome: CallOutcome) -> dict[str, Any]:
    r = outcome.result
    return {
        "prompt_tokens": r.prompt_tokens,
        "completion_tokens": r.output_tokens,
        "total_tokens": r.prompt_tokens + r.output_tokens,
        "prompt_tokens_details": {"cached_tokens": r.cached_tokens},
    }


def _headers(request_id: str, session_id: str, instance: str) -> dict[str, str]:
    return {"x-talaria-session-id": session_id, "x-talaria-instance": instance}


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    ctx = context(request)
    tenant = await _tenant(ctx, request)
    raw = await read_json(request, ctx.settings.max_request_bytes)
    body = parse(ChatCompletionRequest, raw)
    _check_model(ctx, body.model)
    identity = _identity(request, raw)
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    fingerprints = [message_fingerprint(m) for m in messages]
    prompt_tokens = sum(tokens for _, tokens in fingerprints)
    if body.tools:
        prompt_tokens += estimate_tokens(json.dumps(body.tools)) + MESSAGE_OVERHEAD_TOKENS
    from talaria.proxy.synthetic import pick_tool

    call = PreparedCall(
        request_id=request.state.request_id,
        model=body.model,
        identity=identity,
        tenant_id=tenant,
        prompt_tokens=prompt_tokens,
        fingerprints=fingerprints,
        max_tokens=body.max_completion_tokens or body.max_tokens or ctx.settings.max_output_tokens,
        stream=body.stream,
        tool_name=pick_tool(body.tools, body.tool_choice),
        messages=tuple(messages),
    )
    handle = await ctx.gateway.open_call(call)
    headers = _headers(call.request_id, identity.session_id, handle.instance)
    created = int(time.time())
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    if body.stream:
        return StreamingResponse(
            _chat_stream(handle, call, created, include_usage),
            media_type="text/event-stream",
            headers={**headers, "cache-control": "no-cache"},
        )
    outcome = await handle.outcome()
    message: dict[str, Any] = {"role": "assistant", "content": outcome.text}
    if outcome.tool_call is not None:
        message["tool_calls"] = [outcome.tool_call]
    return json_response(
        {
            "id": f"chatcmpl-{call.request_id}",
            "object": "chat.completion",
            "created": created,
            "model": call.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": outcome.finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": _usage(outcome),
            "system_fingerprint": None,
        },
        headers=headers,
    )


def _text(engine_text: str | None, start: int, tokens: int) -> str:
    """The engine's text when it has one, else synthetic words for tokens [start, +tokens)."""
    return engine_text if engine_text is not None else words(start, tokens)


def _sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


async def _chat_stream(
    handle: CallHandle, call: PreparedCall, created: int, include_usage: bool
) -> AsyncIterator[bytes]:
    base = {
        "id": f"chatcmpl-{call.request_id}",
        "object": "chat.completion.chunk",
        "created": created,
        "model": call.model,
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return _sse({**base, "choices": [choice]})

    sent = 0
    while True:
        kind, value = await handle.events.get()
        if kind == "first":
            yield chunk({"role": "assistant", "content": "" if call.tool_name else None})
            if call.tool_name is None:
                yield chunk({"content": _text(value.text, 0, 1)})
                sent = 1
        elif kind == "delta" and call.tool_name is None:
            yield chunk({"content": _text(value.text, sent, value.tokens)})
            sent += value.tokens
        elif kind == "done":
            outcome: CallOutcome = value
            if outcome.tool_call is not None:
                tc = outcome.tool_call
                head = {"index": 0, "id": tc["id"], "type": "function"}
                head["function"] = {"name": tc["function"]["name"], "arguments": ""}
                yield chunk({"tool_calls": [head]})
                for part in chunks_of(tc["function"]["arguments"], 16):
                    yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": part}}]})
            elif sent < outcome.result.output_tokens and outcome.result.output_text is None:
                yield chunk({"content": words(sent, outcome.result.output_tokens - sent)})
            yield chunk({}, outcome.finish_reason)
            if include_usage:
                yield _sse({**base, "choices": [], "usage": _usage(outcome)})
            break
        elif kind == "error":
            error: ApiError = value
            yield error.sse()
            break
    yield b"data: [DONE]\n\n"


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    ctx = context(request)
    tenant = await _tenant(ctx, request)
    raw = await read_json(request, ctx.settings.max_request_bytes)
    body = parse(CompletionRequest, raw)
    _check_model(ctx, body.model)
    if isinstance(body.prompt, list) and len(body.prompt) != 1:
        raise ApiError(400, "Only one prompt per request is supported.", param="prompt")
    prompt = body.prompt if isinstance(body.prompt, str) else body.prompt[0]
    identity = _identity(request, raw)
    fingerprint = message_fingerprint({"role": "user", "content": prompt})
    call = PreparedCall(
        request_id=request.state.request_id,
        model=body.model,
        identity=identity,
        tenant_id=tenant,
        prompt_tokens=estimate_tokens(prompt),
        fingerprints=[fingerprint],
        max_tokens=body.max_tokens or ctx.settings.max_output_tokens,
        stream=body.stream,
        prompt_text=prompt,
    )
    handle = await ctx.gateway.open_call(call)
    headers = _headers(call.request_id, identity.session_id, handle.instance)
    created = int(time.time())
    base = {"id": f"cmpl-{call.request_id}", "created": created, "model": call.model}
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(
            _completion_stream(handle, base, include_usage),
            media_type="text/event-stream",
            headers={**headers, "cache-control": "no-cache"},
        )
    outcome = await handle.outcome()
    choice = {"index": 0, "text": outcome.text, "finish_reason": outcome.finish_reason}
    return json_response(
        {
            **base,
            "object": "text_completion",
            "choices": [{**choice, "logprobs": None}],
            "usage": _usage(outcome),
        },
        headers=headers,
    )


async def _completion_stream(
    handle: CallHandle, base: dict[str, Any], include_usage: bool
) -> AsyncIterator[bytes]:
    sent = 0
    head = {**base, "object": "text_completion"}

    def chunk(text: str, finish: str | None = None) -> bytes:
        choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
        return _sse({**head, "choices": [choice]})

    while True:
        kind, value = await handle.events.get()
        if kind == "first":
            yield chunk(_text(value.text, 0, 1))
            sent = 1
        elif kind == "delta":
            yield chunk(_text(value.text, sent, value.tokens))
            sent += value.tokens
        elif kind == "done":
            outcome: CallOutcome = value
            if sent < outcome.result.output_tokens and outcome.result.output_text is None:
                yield chunk(words(sent, outcome.result.output_tokens - sent))
            yield chunk("", outcome.finish_reason)
            if include_usage:
                yield _sse({**head, "choices": [], "usage": _usage(outcome)})
            break
        elif kind == "error":
            yield value.sse()
            break
    yield b"data: [DONE]\n\n"


@router.get("/v1/models")
async def models(request: Request) -> Response:
    ctx = context(request)
    await _tenant(ctx, request)
    residency = await ctx.gateway.residency()
    data = [
        {
            "id": model,
            "object": "model",
            "created": 0,
            "owned_by": "talaria",
            "context_window": ctx.gateway.context_window(model),
            "instances": residency.get(model, []),
        }
        for model in ctx.gateway.models()
    ]
    return json_response({"object": "list", "data": data})


@router.post("/v1/sessions/{session_id}/hints")
async def session_hint(session_id: str, request: Request) -> Response:
    ctx = context(request)
    tenant = await _tenant(ctx, request)
    hint = parse(HintRequest, await read_json(request, ctx.settings.max_request_bytes))
    known = await ctx.gateway.hint(session_id, tenant, hint.seconds(), hint.tool)
    if not known:
        raise ApiError(404, f"No live session {session_id!r}.", code="session_not_found")
    return json_response({"session_id": session_id, "accepted": True})


@router.post("/v1/sessions/{session_id}/end")
async def session_end(session_id: str, request: Request) -> Response:
    ctx = context(request)
    tenant = await _tenant(ctx, request)
    ended = await ctx.gateway.end_session(session_id, "client", tenant)
    return json_response({"session_id": session_id, "ended": ended})
