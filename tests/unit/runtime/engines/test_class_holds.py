"""The fair queue's rule 5 for vLLM (runtime/engines/class_holds.py): running calls held for a
higher class, released when it leaves, each held at most ``preempt_limit`` times; and on the
vLLM engine against a fake ``AsyncLLM`` (virtual time), a held call is aborted and resubmitted
as its prompt plus its output so far, and its text comes out whole.

Table-driven for the decisions; hypothesis for the invariants over any order of calls entering
and leaving."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from talaria.core.clock import LoopClock
from talaria.core.types import CallRequest, Finished, Priority
from talaria.runtime.engine import ClassStepRule
from talaria.runtime.engines.class_holds import ClassHolds, Ticket
from talaria.runtime.engines.tokenizer import BYTE_OFFSET
from talaria.runtime.engines.vllm import RateModel
from tests.unit.runtime.engines.test_vllm_engine_fake import (
    STEP_S,
    FakeCompletion,
    FakeLLM,
    FakeOutput,
    make_engine,
    request,
    virtual,
)


def _step_s(batch: int, context_tokens: int) -> float:
    """1 per step and 0.1 per sequence: one call alone costs 1.1."""
    return 1.0 + 0.1 * batch


RULE = ClassStepRule(class_slowdown=1.2, preempt_limit=3)


def _holds(rule: ClassStepRule | None = RULE) -> ClassHolds:
    holds = ClassHolds(_step_s)
    holds.rule = rule
    return holds


def _held(holds: ClassHolds) -> list[bool]:
    return [t.held for t in holds.tickets]


@pytest.mark.parametrize(
    ("rule", "ranks", "held"),
    [
        # no rule, or one class: nothing held, whatever it costs
        (None, [2, 2, 2, 0], [False, False, False, False]),
        (RULE, [2, 2, 2, 2], [False, False, False, False]),
        # ide alone 1.1, bound 1.32: two more calls fit (1.3), the rest wait in admission order
        (RULE, [2, 2, 2, 2, 0], [False, False, True, True, False]),
        # lower classes yield by class first: the standard call keeps its steps
        (RULE, [2, 2, 1, 0], [False, True, False, False]),
        # no room at all: every lower-class call is held
        (ClassStepRule(1.0, 3), [2, 1, 0], [True, True, False]),
    ],
)
def test_which_running_calls_are_held(
    rule: ClassStepRule | None, ranks: list[int], held: list[bool]
) -> None:
    holds = _holds(rule)
    for rank in ranks:
        holds.enter(rank, 1000)
    assert _held(holds) == held
    assert holds.preemptions == sum(held)


def test_held_calls_run_again_when_the_higher_class_leaves() -> None:
    holds = _holds(ClassStepRule(1.0, 3))
    bulk = [holds.enter(2, 1000) for _ in range(3)]
    ide = holds.enter(0, 100)
    assert all(t.held for t in bulk) and not ide.held
    holds.leave(ide)
    assert not any(t.held for t in bulk) and holds.preemptions == 3
    holds.leave(ide)  # twice: nothing changes
    assert holds.tickets == bulk


def test_a_call_held_preempt_limit_times_runs_from_then_on() -> None:
    holds = _holds(ClassStepRule(1.0, preempt_limit=2))
    bulk = holds.enter(2, 1000)
    for held_so_far in (1, 2):
        ide = holds.enter(0, 100)
        assert bulk.held and bulk.preempted == held_so_far
        holds.leave(ide)
        assert not bulk.held
    holds.enter(0, 100)
    assert not bulk.held and bulk.preempted == 2 and holds.preemptions == 2


def test_a_rule_taken_away_releases_everyone() -> None:
    holds = _holds(ClassStepRule(1.0, 3))
    tickets = [holds.enter(r, 100) for r in (2, 1, 0)]
    assert [t.held for t in tickets] == [True, True, False]
    holds.rule = None
    holds.decide()
    assert not any(t.held for t in tickets)


@given(
    events=st.lists(st.one_of(st.integers(0, 2), st.just(-1), st.just(-2)), max_size=40),
    slowdown=st.floats(1.0, 2.0),
    limit=st.integers(0, 4),
)
def test_holds_invariants(events: list[int], slowdown: float, limit: int) -> None:
    """Over any order of calls entering (their rank), leaving (-1: the oldest) and becoming
    unpausable (-2: the newest running one, as a chat call that cannot be resumed once it
    streams): the best class present is never held, a call held has a better class running
    beside it, none is held more than ``limit`` times, an unpausable call is never held, the
    count is the sum of the calls' holds, and once every call has left nothing is held."""
    holds = _holds(ClassStepRule(slowdown, limit))
    seen: list[Ticket] = []
    for event in events:
        if event >= 0:
            seen.append(holds.enter(event, 500))
        elif event == -1 and holds.tickets:
            holds.leave(holds.tickets[0])
        elif event == -2:
            running = [t for t in holds.tickets if not t.held]
            if running:
                running[-1].pausable = False
                holds.decide()
        assert not any(t.held for t in holds.tickets if not t.pausable)
        if holds.tickets:
            best = min(t.rank for t in holds.tickets)
            assert all(not t.held for t in holds.tickets if t.rank == best)
            assert all(t.rank > best for t in holds.tickets if t.held)
        assert all(t.preempted <= limit for t in seen)
        assert holds.preemptions == sum(t.preempted for t in seen)
    for ticket in list(holds.tickets):
        holds.leave(ticket)
    assert not any(t.held for t in seen)


# -- on the vLLM engine -----------------------------------------------------------------------
ALPHABET = [BYTE_OFFSET + b for b in b"abcdefghijklmnopqrstuvwxyz"]


def _reply(n: int) -> str:
    return "".join(chr(ALPHABET[i % len(ALPHABET)] - BYTE_OFFSET) for i in range(n))


@dataclass
class ContinuingLLM(FakeLLM):
    """A greedy model: a request's output depends only on the sequence so far, so a request
    resubmitted with its output appended goes on where it stopped (each request id's root, the
    part before ``#``, remembers its first prompt's length)."""

    prompt_lengths: dict[str, int] = field(default_factory=dict)

    async def generate(  # type: ignore[override]
        self, prompt: Any, sampling_params: Any, request_id: str, *, priority: int = 0
    ) -> Any:
        self.calls.append(("generate", request_id, priority, sampling_params, prompt))
        ids = list(prompt["prompt_token_ids"])
        start = len(ids) - self.prompt_lengths.setdefault(request_id.split("#")[0], len(ids))
        cached = self._cached(ids)
        await self.clock.sleep((len(ids) - cached) * 1e-4)
        n = sampling_params["max_tokens"]
        for i in range(n):
            await self.clock.sleep(STEP_S)
            token = ALPHABET[(start + i) % len(ALPHABET)]
            if i == n - 1:
                self.cache.append([*ids, token])
            yield FakeOutput(request_id, cached, [FakeCompletion([token])], i == n - 1)


def _call(rid: str, priority: Priority, max_out: int) -> CallRequest:
    return replace(request(rid, session=rid, max_out=max_out, stream=True), priority=priority)


def _serve_classes(rule: ClassStepRule | None) -> tuple[dict[str, str], ContinuingLLM, int]:
    """Two batch calls of 60 tokens; an interactive one of 12 arrives after 10 steps. Each
    call's text, the fake, and the engine's preemptions."""

    async def body(clock: LoopClock) -> tuple[dict[str, str], ContinuingLLM, int]:
        llm = ContinuingLLM(clock)
        rates = RateModel(decode_step_s_per_seq=2e-3)
        engine, _ = make_engine("a", clock, sleep_mode=False, rates=rates, llm=llm)
        await engine.start()
        await engine.activate()
        engine.step_by_class(rule)

        async def serve(req: CallRequest, after_s: float) -> tuple[str, str]:
            await clock.sleep(after_s)
            admission = engine.try_admit(req, clock.now(), False)
            assert admission is not None
            events = [e async for e in engine.run(admission)]
            last = events[-1]
            assert isinstance(last, Finished)
            assert last.result.output_tokens == req.max_output_tokens
            return req.request_id, last.result.output.text

        texts = await asyncio.gather(
            serve(_call("bulk-1", Priority.BATCH, 60), 0.0),
            serve(_call("bulk-2", Priority.BATCH, 60), 0.0),
            serve(_call("ide", Priority.INTERACTIVE, 12), 10 * STEP_S),
        )
        return dict(texts), llm, engine.preemptions

    return virtual(body)


def test_held_calls_are_resubmitted_with_their_output_and_come_out_whole() -> None:
    texts, llm, preemptions = _serve_classes(ClassStepRule(class_slowdown=1.0, preempt_limit=3))
    assert texts == {"bulk-1": _reply(60), "bulk-2": _reply(60), "ide": _reply(12)}
    assert preemptions == 2
    pieces: dict[str, list[tuple[int, int]]] = {}
    for _, rid, _, params, prompt in (c for c in llm.calls if c[0] == "generate"):
        pieces.setdefault(rid.split("#")[0], []).append(
            (len(prompt["prompt_token_ids"]), params["max_tokens"])
        )
    assert len(pieces["ide"]) == 1
    for bulk in ("bulk-1", "bulk-2"):
        (first_len, first_max), (again_len, again_max) = pieces[bulk]
        done = again_len - first_len  # the output so far went back in with the prompt
        assert first_max == 60 and 0 < done < 60 and again_max == 60 - done


def test_without_a_rule_nothing_is_held() -> None:
    texts, llm, preemptions = _serve_classes(None)
    assert texts == {"bulk-1": _reply(60), "bulk-2": _reply(60), "ide": _reply(12)}
    assert preemptions == 0 and len([c for c in llm.calls if c[0] == "generate"]) == 3
