"""The proxy ↔ runtime protocol: every document survives encoding to JSON text and back, and a
peer speaking another version is refused."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from talaria.core.calls import (
    Call,
    ModelOutput,
    OutputAccumulator,
    OutputDelta,
    Sampling,
    TokenLogprob,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolSpec,
)
from talaria.core.gap_model import GapFigures
from talaria.core.protocol import PROTOCOL_VERSION, ProtocolError
from talaria.core.protocol_calls import request_from_dict, request_to_dict
from talaria.core.protocol_events import ErrorEvent, event_from_dict, event_to_dict
from talaria.core.protocol_status import status_from_dict, status_to_dict
from talaria.core.status import (
    InstanceStatus,
    ModelResidency,
    ModelState,
    SessionKvStatus,
    SlotView,
    TenantShare,
)
from talaria.core.types import (
    CallRequest,
    CallResult,
    EngineTimes,
    Finished,
    FirstToken,
    KvSource,
    Priority,
    TokenDelta,
)


def _wire(data: dict[str, Any]) -> dict[str, Any]:
    """Through JSON text, as on the socket."""
    decoded: dict[str, Any] = json.loads(json.dumps(data))
    return decoded


FULL_REQUEST = CallRequest(
    request_id="r1",
    session_key="ses_1",
    model="glm-4.5-fp8",
    prompt_tokens=120,
    max_output_tokens=64,
    call_index=3,
    expected_tool_gap_s=2.5,
    session_final=True,
    stream=True,
    shared_prefix_tokens=100,
    call=Call(
        model="glm-4.5-fp8",
        messages=(
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
        ),
        tools=(ToolSpec("ls", "list files", {"type": "object", "properties": {}}, strict=True),),
        tool_choice=ToolChoice("named", "ls"),
        sampling=Sampling(
            temperature=0.0,
            top_p=0.9,
            top_k=40,
            seed=7,
            stop=("\n\n", "END"),
            presence_penalty=0.1,
            frequency_penalty=-0.1,
            logprobs=True,
            top_logprobs=3,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
        ),
        max_output_tokens=64,
        stream=True,
        reasoning_effort="high",
        parallel_tool_calls=False,
        template_kwargs={"enable_thinking": False},
    ),
    output_tokens=17,
    tenant="t-3f2a",
    tenant_weight=2.5,
    priority=Priority.INTERACTIVE,
    deadline_s=30.0,
    parent_session_key="ses_parent",
    parent_prefix_tokens=512,
    agent="claude-cli",
)


def test_a_full_request_round_trips() -> None:
    assert request_from_dict(_wire(request_to_dict(FULL_REQUEST))) == FULL_REQUEST


def test_a_minimal_request_round_trips() -> None:
    minimal = CallRequest("r", "s", "m", prompt_tokens=1, max_output_tokens=1)
    assert request_from_dict(_wire(request_to_dict(minimal))) == minimal


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"v": 1}, "protocol version 1"),
        ({"v": None}, "protocol version None"),
        ({"surprise": 1}, "unknown call request fields"),
        ({"prompt_tokens": 0}, "must be positive"),
        ({"sampling": {"temperature": 1, "warmth": 2}}, "unknown sampling fields"),
        ({"tools": [{"name": "x", "colour": "red"}]}, "bad call request"),
        ({"priority": "urgent"}, "unknown priority"),
        ({"tenant_weight": 0}, "tenant_weight"),
        ({"tenant_weight": 101}, "tenant_weight"),
        ({"deadline_s": -1}, "deadline_s"),
        ({"parent_session_key": 3}, "parent_session_key"),
        ({"parent_prefix_tokens": -1}, "parent_prefix_tokens"),
        ({"parent_prefix_tokens": "10"}, "parent_prefix_tokens"),
        ({"parent_prefix_tokens": True}, "parent_prefix_tokens"),
        ({"agent": 7}, "agent must be a string"),
        ({"agent": "a" * 65}, "agent must be a string"),
    ],
)
def test_bad_requests_are_refused(change: dict[str, Any], message: str) -> None:
    data = request_to_dict(FULL_REQUEST)
    for key, value in change.items():
        if key in ("sampling", "tools"):  # members of the nested call document
            data["call"] = {**data["call"], key: value}
        else:
            data[key] = value
    with pytest.raises(ProtocolError, match=message):
        request_from_dict(data)


def test_a_call_document_with_unknown_fields_is_refused() -> None:
    data = request_to_dict(FULL_REQUEST)
    data["call"] = {**data["call"], "colour": "red"}
    with pytest.raises(ProtocolError, match="unknown call fields"):
        request_from_dict(data)


OUTPUT = ModelOutput(
    "done",
    "thinking",
    (ToolCall("c1", "ls", '{"path": "."}'),),
    finish_reason="tool_calls",
    logprobs=(TokenLogprob("do", -0.1, (("do", -0.1), ("go", -2.5))), TokenLogprob("ne", -0.3)),
)
RESULT = CallResult(
    request_id="r1",
    session_key="ses_1",
    model="m",
    node="n0",
    prompt_tokens=10,
    cached_tokens=8,
    output_tokens=4,
    arrival_s=1.0,
    admitted_s=1.5,
    first_token_s=2.0,
    finished_s=3.0,
    kv_source=KvSource.HOST,
    restored_bytes=1e6,
    recomputed_tokens=0,
    sp_admitted=True,
    output=OUTPUT,
    slot_wait_s=0.25,
)
DELTA = OutputDelta(
    "a",
    "b",
    (ToolCallDelta(0, "c1", "ls", '{"pa'), ToolCallDelta(1, None, None)),
    (TokenLogprob("a", -0.5, (("a", -0.5),)),),
)


@pytest.mark.parametrize(
    "event",
    [
        FirstToken(2.0, 8, KvSource.HBM, DELTA),
        FirstToken(2.0, 0, KvSource.NEW, None),
        TokenDelta(2.5, 3, DELTA),
        TokenDelta(2.5, 3, None),
        Finished(RESULT),
        Finished(CallResult(**{**RESULT.__dict__, "output": None})),
        Finished(CallResult(**{**RESULT.__dict__, "slot_wait_s": 0.0})),
        Finished(CallResult(**{**RESULT.__dict__, "engine": EngineTimes(1.6, 1.7, 1.9, 2.9)})),
        ErrorEvent("engine crashed"),
        ErrorEvent("too long", "context_length_exceeded", "messages"),
    ],
)
def test_every_event_round_trips(event: Any) -> None:
    assert event_from_dict(_wire(event_to_dict(event))) == event


def test_a_result_from_before_slot_wait_decodes_with_none_waited() -> None:
    document = _wire(event_to_dict(Finished(RESULT)))
    del document["result"]["slot_wait_s"]
    assert event_from_dict(document) == Finished(
        CallResult(**{**RESULT.__dict__, "slot_wait_s": 0})
    )


def test_a_result_from_before_engine_times_decodes_without_them() -> None:
    timed = CallResult(**{**RESULT.__dict__, "engine": EngineTimes(1.6, 1.7, 1.9, 2.9)})
    document = _wire(event_to_dict(Finished(timed)))
    del document["result"]["engine"]
    assert event_from_dict(document) == Finished(RESULT)


def test_engine_times_from_a_newer_peer_keep_what_this_one_knows() -> None:
    timed = CallResult(**{**RESULT.__dict__, "engine": EngineTimes(1.6, 1.7, 1.9, 2.9)})
    document = _wire(event_to_dict(Finished(timed)))
    document["result"]["engine"]["preempted_s"] = 2.0
    assert event_from_dict(document) == Finished(timed)


def test_unknown_or_broken_events_are_refused() -> None:
    with pytest.raises(ProtocolError, match="unexpected event"):
        event_from_dict({"type": "gossip"})
    with pytest.raises(ProtocolError, match="bad first event"):
        event_from_dict({"type": "first", "t_s": 1.0})


def test_version_5_names_the_session_key_and_a_version_4_request_is_refused() -> None:
    """v5 sends the proxy's key as ``session_key`` (v4 called it ``session_id``): a v4 peer's
    request is refused by its version, not misread."""
    data = _wire(request_to_dict(FULL_REQUEST))
    assert data["v"] == PROTOCOL_VERSION == 9
    assert data["session_key"] == "ses_1" and "session_id" not in data
    result = _wire(event_to_dict(Finished(RESULT)))["result"]
    assert result["session_key"] == "ses_1" and "session_id" not in result
    v4 = {k: v for k, v in data.items() if k != "session_key"}
    with pytest.raises(ProtocolError, match="protocol version 4"):
        request_from_dict({**v4, "session_id": "ses_1", "v": 4})


STATUS = InstanceStatus(
    instance="n0",
    at_s=12.0,
    active_model="a",
    models={
        "a": ModelResidency(
            "a", ModelState.ACTIVE, 0.0, 0.5, 1.0, waiting_calls=1, live_sessions=3
        ),
        "b": ModelResidency("b", ModelState.HOST, 40.0, 0.0, 6.0, waiting_calls=1, live_sessions=1),
    },
    sessions={"ses_1": SessionKvStatus("hbm", 100, "a", 0.0, 0.2)},
    reserved={"ses_1": 1e9},
    waiting_calls=2,
    waiting_prompt_tokens=300,
    running_calls=1,
    kv_utilization=0.25,
    recent_slots=[
        SlotView("b", 0.0, 4.0, end_s=8.0, close="quantum", admitted=3),
        SlotView("a", 8.0, 2.5),
    ],
    tenants={"9f0c": TenantShare(31.5, 2, 1, 4.25), "77aa": TenantShare(2.0)},
    gap_models={"mean": GapFigures(12, 0.9245, 0.75, 0.95), "log-normal": GapFigures()},
)


def test_status_round_trips_with_its_extras_and_version() -> None:
    status = STATUS
    document = _wire(status_to_dict(status, model_names=["a"], slots=[], engines={}))
    assert document["v"] == PROTOCOL_VERSION and document["model_names"] == ["a"]
    assert status_from_dict(document) == status
    with pytest.raises(ProtocolError, match="protocol version"):
        status_from_dict({**document, "v": PROTOCOL_VERSION + 1})


def test_a_status_from_before_slots_and_queues_decodes_with_none() -> None:
    document = _wire(status_to_dict(STATUS, model_names=["a", "b"], slots=[], engines={}))
    del document["recent_slots"]
    del document["tenants"]
    for residency in document["models"].values():
        del residency["waiting_calls"]
        del residency["live_sessions"]
    old = status_from_dict(document)
    assert old.recent_slots == [] and old.tenants == {}
    assert {m: r.waiting_calls for m, r in old.models.items()} == {"a": 0, "b": 0}
    assert {m: r.live_sessions for m, r in old.models.items()} == {"a": 0, "b": 0}
    assert old == replace(
        STATUS,
        recent_slots=[],
        tenants={},
        models={m: replace(r, waiting_calls=0, live_sessions=0) for m, r in STATUS.models.items()},
    )


_text = st.text(max_size=20)


@given(
    st.builds(
        ModelOutput,
        _text,
        _text,
        st.lists(st.builds(ToolCall, _text, _text, _text), max_size=3).map(tuple),
        st.sampled_from(["stop", "length", "tool_calls"]),
    )
)
def test_any_output_round_trips(output: ModelOutput) -> None:
    event = Finished(CallResult(**{**RESULT.__dict__, "output": output}))
    assert event_from_dict(_wire(event_to_dict(event))) == event


def test_an_accumulator_folds_deltas_back_into_the_output() -> None:
    folded = OutputAccumulator()
    for delta in OUTPUT.deltas():
        folded.add(delta)
    assert folded.output(OUTPUT.finish_reason) == OUTPUT
