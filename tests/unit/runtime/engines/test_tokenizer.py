"""The byte tokenizer, its chat template, and the streaming decoder
(runtime/engines/tokenizer.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from talaria.runtime.engines.tokenizer import (
    BOS_ID,
    BYTE_OFFSET,
    EOS_ID,
    GENERATION_PROMPT,
    PAD_ID,
    ByteTokenizer,
    IncrementalDecoder,
    load_tokenizer,
    render_chat,
)

TOK = ByteTokenizer()

CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Fix the failing test in tests/test_x.py ✓"},
    {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "tests/test_x.py"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "def test_x(): assert 1 == 2"},
    {"role": "assistant", "content": [{"type": "text", "text": "The assertion is wrong."}]},
    {"role": "user", "content": "Then fix it."},
]


def test_encode_is_bos_plus_bytes() -> None:
    assert TOK.encode("") == [BOS_ID]
    assert TOK.encode("A") == [BOS_ID, BYTE_OFFSET + 65]
    assert TOK.encode("é") == [BOS_ID, BYTE_OFFSET + 0xC3, BYTE_OFFSET + 0xA9]
    assert max(TOK.encode("ÿ" * 3)) < TOK.vocab_size


@given(st.text())
def test_round_trip(text: str) -> None:
    assert TOK.decode(TOK.encode(text)) == text


def test_decode_special_and_out_of_range_ids() -> None:
    ids = [PAD_ID, BOS_ID, BYTE_OFFSET + 104, BYTE_OFFSET + 105, EOS_ID, 517, BYTE_OFFSET + 33]
    assert TOK.decode(ids) == "hi<517>!"
    assert TOK.decode([BYTE_OFFSET + 0xFF]) == "\ufffd"  # not UTF-8: replaced


def test_template_shape() -> None:
    text = render_chat(CONVERSATION)
    assert text.startswith("<|system|>\nYou are a coding agent.\n<|user|>\n")
    assert text.endswith("<|user|>\nThen fix it.\n" + GENERATION_PROMPT)
    call = '<|tool_call|>{"arguments":"{\\"path\\": \\"tests/test_x.py\\"}","id":"call_1",'
    assert "<|assistant|>\nLet me look." + call in text
    assert "<|tool|>\ndef test_x(): assert 1 == 2\n" in text
    assert "<|assistant|>\nThe assertion is wrong.\n" in text
    parsed = json.loads(text.split("<|tool_call|>")[1].split("\n")[0])
    assert parsed == {
        "id": "call_1",
        "name": "read_file",
        "arguments": '{"path": "tests/test_x.py"}',
    }
    assert render_chat(CONVERSATION, add_generation_prompt=False) + GENERATION_PROMPT == text


@pytest.mark.parametrize("k", range(len(CONVERSATION) + 1))
def test_prefix_stability(k: int) -> None:
    """Appending messages only appends tokens (prefix caching depends on it)."""
    head = TOK.encode(render_chat(CONVERSATION[:k], add_generation_prompt=False))
    full = TOK.encode_chat(CONVERSATION)
    assert full[: len(head)] == head


def test_prompt_plus_output_is_a_prefix_of_the_next_prompt() -> None:
    """A call's prompt (ending with the generation prompt) + its output text is where the next
    call's prompt starts, when the output comes back as the assistant message's content."""
    history = CONVERSATION[:2]
    prompt = TOK.encode_chat(history)
    output = "I will read the test file."
    generated = [BYTE_OFFSET + b for b in output.encode()]
    follow_up = [*history, {"role": "assistant", "content": output}, CONVERSATION[5]]
    nxt = TOK.encode_chat(follow_up)
    assert nxt[: len(prompt) + len(generated)] == prompt + generated


def test_incremental_decoder_holds_back_partial_characters() -> None:
    decoder = IncrementalDecoder(TOK)
    ids = TOK.encode("a€b")[1:]  # '€' is three bytes
    deltas = [decoder.push([i]) for i in ids]
    assert deltas == ["a", "", "", "€", "b"]
    assert decoder.finish() == ""
    assert decoder.text == "a€b"


def test_incremental_decoder_flushes_invalid_tail() -> None:
    decoder = IncrementalDecoder(TOK)
    assert decoder.push([BYTE_OFFSET + 0xE2, BYTE_OFFSET + 0x82]) == ""
    assert decoder.finish() == "\ufffd"
    assert decoder.text == "\ufffd"


@given(st.lists(st.integers(min_value=0, max_value=1023), max_size=60), st.integers(1, 5))
def test_incremental_decoder_matches_full_decode(ids: list[int], chunk: int) -> None:
    decoder = IncrementalDecoder(TOK)
    text = "".join(decoder.push(ids[i : i + chunk]) for i in range(0, len(ids), chunk))
    text += decoder.finish()
    assert text == decoder.text == TOK.decode(ids)


def test_load_tokenizer_picks_the_byte_tokenizer_for_config_only_dirs(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert isinstance(load_tokenizer(tmp_path), ByteTokenizer)
    from talaria.runtime.engines.vllm import tiny_model_dir

    assert isinstance(load_tokenizer(tiny_model_dir("tiny-llama-a")), ByteTokenizer)
