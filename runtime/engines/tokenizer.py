"""Tokenizers for engines that serve real tokens: a byte tokenizer for the tiny test models, and
a ``transformers`` tokenizer for real model directories (loaded lazily).

Byte tokenizer (``ByteTokenizer``), for the random-weight test models of ``runtime/models/``
(vocabulary 1024):

- id 0 = pad, 1 = bos, 2 = eos, ids 3..258 = the bytes 0..255;
- ``encode(text)`` = bos + the UTF-8 bytes of ``text``;
- ``decode(ids)`` = the bytes of the in-range ids, UTF-8 decoded with ``errors="replace"``;
  pad/bos/eos render as nothing; an id ≥ 259 (the model may sample any of its 1024 ids) renders
  as the placeholder ``<id>`` (e.g. ``<517>``), so that every generated token leaves a visible
  trace in the text. Placeholders do not round-trip: re-encoding ``<517>`` gives five byte ids.
  So by default the engine lets the tiny models generate only ``TEXT_IDS`` (newline and
  printable ASCII): their output text then re-encodes to the very ids generated, and a
  session's next prompt extends the previous prompt + output token for token, as a real model's
  would with its own tokenizer.

Chat template (``render_chat``, used by the byte tokenizer; real models use their own template):

```
<|system|>\\n{content}\\n
<|user|>\\n{content}\\n
<|assistant|>\\n{content}{<|tool_call|>{json}\\n ...}\\n
<|tool|>\\n{content}\\n
<|assistant|>\\n                      ← generation prompt
```

Every message renders to a block that depends on that message alone, so the template is
*prefix-stable*: the rendering of ``messages[:k]`` is a prefix of the rendering of ``messages``,
and the prompt of one call (ending with the generation prompt ``<|assistant|>\\n``) followed by
its output text is a prefix of the next call's prompt (where that output is the assistant
message's content). Prefix caching relies on this.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from talaria.core.calls import content_text

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
BYTE_OFFSET = 3
"""Id of byte 0; byte ``b`` is id ``BYTE_OFFSET + b``."""
BYTE_VOCAB_SIZE = 1024
"""The tiny models' vocabulary: 259 ids in use, the rest never produced by ``encode``."""
PLACEHOLDER = "<{id}>"
"""How ``ByteTokenizer.decode`` renders an id outside the byte range (≥ 259)."""
TEXT_IDS: tuple[int, ...] = tuple(BYTE_OFFSET + b for b in (10, *range(32, 127)))
"""Newline and printable ASCII: what the tiny models are allowed to generate by default
(``SamplingParams.allowed_token_ids``), so their output round-trips through the tokenizer."""

GENERATION_PROMPT = "<|assistant|>\n"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
"""A model directory holding any of these gets a ``transformers`` tokenizer."""


class Tokenizer(Protocol):
    """What an engine needs from a tokenizer."""

    @property
    def eos_token_id(self) -> int | None:
        """The end-of-sequence id, if the tokenizer has one."""
        ...

    def encode(self, text: str) -> list[int]:
        """Token ids of a plain-text prompt, with the model's beginning-of-sequence token."""
        ...

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Token ids of ``messages`` rendered with the chat template, ending with the
        generation prompt (with ``tools`` and ``template_kwargs`` where the template takes
        them)."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` (special tokens left out)."""
        ...


def _tool_call_json(call: Mapping[str, Any]) -> str:
    """One OpenAI tool call as compact JSON: ``{"id", "name", "arguments"}``."""
    function = call.get("function")
    fn: Mapping[str, Any] = function if isinstance(function, Mapping) else call
    payload = {"id": call.get("id"), "name": fn.get("name"), "arguments": fn.get("arguments")}
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def render_message(message: Mapping[str, Any]) -> str:
    """One message's block of the byte chat template (see the module docstring)."""
    role = str(message.get("role", "user"))
    if role == "developer":
        role = "system"
    if role == "function":
        role = "tool"
    text = content_text(message.get("content"))
    if role == "assistant":
        calls = message.get("tool_calls") or ()
        text += "".join(f"<|tool_call|>{_tool_call_json(c)}\n" for c in calls)
    return f"<|{role}|>\n{text}\n"


def render_chat(messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
    """The byte chat template: each message's block in order, then (by default) the assistant
    header that the model continues from."""
    text = "".join(render_message(m) for m in messages)
    return text + GENERATION_PROMPT if add_generation_prompt else text


class ByteTokenizer:
    """Bytes as tokens (see the module docstring); for the tiny random-weight models."""

    vocab_size = BYTE_VOCAB_SIZE

    @property
    def eos_token_id(self) -> int | None:
        """``EOS_ID`` (2)."""
        return EOS_ID

    def encode(self, text: str) -> list[int]:
        """bos + the UTF-8 bytes of ``text``, each as ``BYTE_OFFSET`` + byte."""
        return [BOS_ID, *(BYTE_OFFSET + b for b in text.encode("utf-8"))]

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """The byte template renders messages only."""
        return self.encode(render_chat(messages))

    def render_chat(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """The byte chat template's text (``render_chat``)."""
        return render_chat(messages)

    def decode(self, ids: Sequence[int]) -> str:
        """The bytes of the in-range ids as UTF-8 (errors replaced); pad, bos and eos as
        nothing; an id ≥ 259 as ``<id>``."""
        out: list[str] = []
        pending = bytearray()
        for i in ids:
            if BYTE_OFFSET <= i < BYTE_OFFSET + 256:
                pending.append(i - BYTE_OFFSET)
                continue
            if pending:
                out.append(pending.decode("utf-8", errors="replace"))
                pending.clear()
            if i >= BYTE_OFFSET + 256:
                out.append(PLACEHOLDER.format(id=i))
        if pending:
            out.append(pending.decode("utf-8", errors="replace"))
        return "".join(out)


class HFTokenizer:
    """A ``transformers`` tokenizer behind the ``Tokenizer`` protocol. The chat template is
    ``chat_template`` (the template text vLLM serves the model with: the node's option) or else
    the model's own, rendered with ``apply_chat_template`` and encoded without adding special
    tokens again (the template writes them): the same ids vLLM's chat layer computes."""

    def __init__(self, tokenizer: Any, chat_template: str | None = None) -> None:
        self._tok = tokenizer
        self.chat_template = chat_template

    @property
    def special_tokens(self) -> tuple[str, ...]:
        """The text of every special token (bos, eos, pad, the chat markers)."""
        return tuple(str(t) for t in getattr(self._tok, "all_special_tokens", ()))

    @property
    def eos_token_id(self) -> int | None:
        """The wrapped tokenizer's end-of-sequence id, if it is an int."""
        eos = getattr(self._tok, "eos_token_id", None)
        return eos if isinstance(eos, int) else None

    def encode(self, text: str) -> list[int]:
        """The wrapped tokenizer's ids of ``text``, with its special tokens."""
        return list(self._tok.encode(text, add_special_tokens=True))

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The model's chat template applied to ``messages`` (and ``tools``), ending with
        the generation prompt, as text."""
        text = self._tok.apply_chat_template(
            [dict(m) for m in messages],
            tools=[dict(t) for t in tools] if tools else None,
            chat_template=self.chat_template,
            tokenize=False,
            add_generation_prompt=True,
            **dict(template_kwargs or {}),
        )
        return str(text)

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """``render_chat``'s text encoded without adding special tokens again."""
        text = self.render_chat(messages, tools, template_kwargs)
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        """The wrapped tokenizer's text of ``ids``, special tokens skipped."""
        return str(self._tok.decode(list(ids), skip_special_tokens=True))


def has_tokenizer_files(model_dir: str | Path) -> bool:
    """The directory holds any of ``TOKENIZER_FILES``."""
    path = Path(model_dir)
    return any((path / name).is_file() for name in TOKENIZER_FILES)


def load_tokenizer(model_dir: str | Path, chat_template: str | None = None) -> Tokenizer:
    """The model's tokenizer: a local directory with tokenizer files, or a name that is not a
    local directory (a Hugging Face repo id), gets ``transformers.AutoTokenizer`` (imported
    here, lazily) with ``chat_template`` (a file or the template's text, as vLLM's
    ``--chat-template`` takes it; None: the model's own); a local directory without tokenizer
    files (the tiny test models) gets the byte tokenizer."""
    path = Path(model_dir)
    if path.is_dir() and not has_tokenizer_files(path):
        return ByteTokenizer()
    from transformers import AutoTokenizer

    return HFTokenizer(AutoTokenizer.from_pretrained(str(model_dir)), template_text(chat_template))


def template_text(chat_template: str | None) -> str | None:
    """A chat template given as a file path or as its text (vLLM's rule: a path that exists is
    read), or None."""
    if chat_template is None:
        return None
    path = Path(chat_template)
    try:
        if path.is_file():
            return path.read_text()
    except OSError:  # a template's text too long to be a path
        pass
    return chat_template


PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "talaria_probe_tool",
        "description": "A probe.",
        "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
    },
}
PROBE_MESSAGES = (
    {"role": "user", "content": "probe"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_probe",
                "type": "function",
                "function": {"name": "talaria_probe_tool", "arguments": '{"x": "1"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_probe", "content": "talaria_probe_result"},
)
"""A conversation an agent's template must render: a tool offered, an assistant turn of one
tool call with ``content: None``, and the tool's result."""


def tool_template_fault(tokenizer: HFTokenizer) -> str | None:
    """Why ``tokenizer``'s chat template cannot serve tool calls, or None when it can: it must
    render :data:`PROBE_MESSAGES` with :data:`PROBE_TOOL` without raising, showing the tool's
    name (the model is told about it) and the tool's result (the model reads it)."""
    try:
        text = tokenizer.render_chat(PROBE_MESSAGES, [PROBE_TOOL])
    except Exception as exc:
        return f"rendering a tool call and its result raised {type(exc).__name__}: {exc}"
    missing = [w for w in ("talaria_probe_tool", "talaria_probe_result") if w not in text]
    if missing:
        what = {"talaria_probe_tool": "the offered tools", "talaria_probe_result": "tool results"}
        return "it does not render " + " or ".join(what[w] for w in missing)
    return None


REPLACEMENT = "\ufffd"


class IncrementalDecoder:
    """Turns token ids arriving a few at a time into text deltas.

    The usual streaming detokenizer: text is only emitted once it no longer ends in a
    replacement character (an incomplete UTF-8 sequence, or a multi-token character); the
    held-back tail is flushed by ``finish``. Each step decodes only the ids from the last
    stable point, so the cost does not grow with the output length.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self._ids: list[int] = []
        self._prefix = 0  # ids before this are emitted and final
        self._read = 0  # ids before this are emitted (those from _prefix give context)
        self.text = ""
        """Everything emitted so far."""

    def push(self, ids: Sequence[int]) -> str:
        """Add ``ids``; return the text that became final."""
        self._ids.extend(ids)
        before = self._tok.decode(self._ids[self._prefix : self._read])
        now = self._tok.decode(self._ids[self._prefix :])
        if len(now) <= len(before) or now.endswith(REPLACEMENT):
            return ""
        delta = now[len(before) :]
        self._prefix, self._read = self._read, len(self._ids)
        self.text += delta
        return delta

    def finish(self) -> str:
        """The held-back tail (possibly with replacement characters)."""
        before = self._tok.decode(self._ids[self._prefix : self._read])
        now = self._tok.decode(self._ids[self._prefix :])
        delta = now[len(before) :] if now.startswith(before) else ""
        self._prefix = self._read = len(self._ids)
        self.text += delta
        return delta
