"""One call on an upstream server, from its request to its ``CallResult`` (the engine's
``run``, engine.py): the request sent (with the tenant's ``cache_salt`` where the server
isolates by it, and the call's class as the server's ``priority`` where it takes one), the
stream read within its bounds (client.py, reading.py), the output cut at the call's limit and
the usage checked against what was sent (usage.py).

What is recorded of the server's answer:

- output: the deltas up to the call's limit, counted as usage.py says (a delta that would
  pass it is dropped, the stream is closed — the server aborts the request — and the call
  finishes with ``length``);
- prompt, output and cached tokens: the last usage the stream carried, each within its
  range (usage.py ``checked_usage``; out-of-range counts are logged and clamped); the
  request's estimate and the deltas' count where the stream carried none or was cut;
- cached tokens as the caller sees them: the server's with ``cache_isolation = "salt"`` or
  ``"share"``, 0 with ``"hide"`` (options.py says why); the KV source (``HBM`` when the
  server reused a prefix, else ``RECOMPUTE`` for a session it served before, ``NEW``) is
  the server's in every mode.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from talaria.core.calls import FinishReason, OutputAccumulator, OutputDelta
from talaria.core.clock import Clock
from talaria.core.types import (
    CallRejected,
    Finished,
    FirstToken,
    GenerationEvent,
    KvSource,
    TokenDelta,
)
from talaria.runtime.engine import Admission, call_result
from talaria.runtime.engines.openai_wire import ChatTotals, parse_chunk
from talaria.runtime.engines.priorities import server_priority
from talaria.runtime.engines.timing import BusyMeter
from talaria.runtime.engines.upstream.client import (
    LOGGED_CHARS,
    MESSAGE_CHARS,
    UpstreamClient,
    chat_body,
)
from talaria.runtime.engines.upstream.options import UpstreamOptions
from talaria.runtime.engines.upstream.reading import UpstreamUnavailable
from talaria.runtime.engines.upstream.usage import (
    OutputBudget,
    SentUsage,
    checked_usage,
    delta_tokens,
    prompt_bounds,
    read_usage,
    reply_max_bytes,
)

log = logging.getLogger(__name__)

MALFORMED = (ValueError, TypeError, AttributeError, KeyError, IndexError, OverflowError)
"""What ``parse_chunk`` raises on a chunk of the wrong shape (a string where a list goes)."""


def _finish(reason: str) -> FinishReason:
    if reason == "tool_calls":
        return "tool_calls"
    return "length" if reason == "length" else "stop"


@dataclass(frozen=True)
class CallSite:
    """What a call needs of its engine: the model's name, its server's client and options,
    the node's clock and name, and the engine's busy meter."""

    model: str
    client: UpstreamClient
    options: UpstreamOptions
    clock: Clock
    node: str
    busy: BusyMeter


def _chunk_fault(exc: Exception, url: str, model: str) -> Exception:
    """What a chunk ``parse_chunk`` refused is: the caller's ``CallRejected`` (its message cut
    to ``MESSAGE_CHARS``), or ``UpstreamUnavailable`` naming the kind of fault, not the
    content (an error chunk's message goes to the log)."""
    if isinstance(exc, CallRejected):
        return CallRejected(exc.code, str(exc)[:MESSAGE_CHARS], exc.param)
    if isinstance(exc, RuntimeError):
        log.warning("%s: upstream %s sent an error: %s", model, url, str(exc)[:LOGGED_CHARS])
        return UpstreamUnavailable(f"upstream {url}: the stream carried an error")
    return UpstreamUnavailable(f"upstream {url}: a malformed chunk ({type(exc).__name__})")


async def generate(
    site: CallSite, admission: Admission, held: tuple[int, int] | None
) -> AsyncGenerator[GenerationEvent, None]:
    """The call's events (``FirstToken``, ``TokenDelta``s for a streaming call, ``Finished``:
    module docstring); ``held``: what the engine remembers of the call's session (its last
    prompt + output tokens and the sleep epoch then), None for a first call."""
    request = admission.request
    call = request.call
    assert call is not None and call.messages is not None, "the engine checks the call"
    opt = site.options
    limited = call.max_output_tokens is not None or request.output_tokens is not None
    limit = request.output_tokens or request.max_output_tokens
    salt = request.cache_salt if opt.cache_isolation == "salt" else None
    priority = server_priority(opt.priority, request.priority, admission.sp_admitted)
    body = chat_body(call, opt.served_model, limit if limited else None, salt, priority)
    raw = json.dumps(body).encode()
    prompt = prompt_bounds(body["messages"], len(raw))
    budget = OutputBudget(limit)
    totals = ChatTotals()
    sent: SentUsage | None = None
    output = OutputAccumulator()
    first_s: float | None = None
    finish: FinishReason = "stop"
    url = site.client.url
    site.busy.begin()
    try:
        stream = site.client.stream_chat(raw, reply_max_bytes(limit, opt.reply_bytes_per_token))
        async with contextlib.aclosing(stream) as chunks:
            async for data in chunks:
                if "usage" in data:
                    sent = read_usage(data["usage"]) or sent
                    data = {k: v for k, v in data.items() if k != "usage"}
                try:
                    chunk = parse_chunk(data, totals)
                except (RuntimeError, *MALFORMED) as exc:
                    raise _chunk_fault(exc, url, site.model) from exc
                if chunk is None:
                    continue
                if chunk.finish_reason is not None:
                    finish = _finish(str(chunk.finish_reason))
                if chunk.delta.empty:
                    continue
                if not budget.take(chunk.delta, len(chunk.token_ids)):
                    finish = "length"  # past the call's limit: the stream closes here
                    break
                now = site.clock.now()
                delta = chunk.delta
                output.add(delta)
                if first_s is None:
                    first_s = now
                    yield FirstToken(now, admission.cached_tokens, admission.kv_source, delta)
                elif request.stream:
                    yield TokenDelta(now, delta_tokens(delta, len(chunk.token_ids)), delta)
    finally:
        site.busy.end()
    if first_s is None:  # an empty reply: its first (and last) token is the end
        first_s = site.clock.now()
        yield FirstToken(first_s, admission.cached_tokens, admission.kv_source, OutputDelta())
    usage = sent or SentUsage()
    check = checked_usage(
        prompt_sent=usage.prompt_tokens,
        output_sent=None if budget.cut else usage.completion_tokens,
        cached_sent=usage.cached_tokens or 0,
        prompt=prompt,
        prompt_estimate=request.prompt_tokens,
        budget=budget,
    )
    if check.faults:
        log.warning("%s: upstream %s usage out of range: %s", site.model, url,
                    "; ".join(check.faults))  # fmt: skip
    server_cached = check.cached_tokens
    if server_cached > 0:
        source = KvSource.HBM
    else:
        source = KvSource.NEW if held is None else KvSource.RECOMPUTE
    recomputed = min(held[0], check.prompt_tokens) if held is not None and not server_cached else 0
    shown_cached = 0 if opt.cache_isolation == "hide" else server_cached
    yield Finished(
        call_result(
            admission,
            site.node,
            prompt_tokens=check.prompt_tokens,
            cached_tokens=shown_cached,
            output_tokens=check.output_tokens,
            first_token_s=first_s,
            finished_s=site.clock.now(),
            kv_source=source,
            recomputed_tokens=recomputed,
            output=output.output(finish),
        )
    )
