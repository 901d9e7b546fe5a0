"""A tiny random-weight chat model with a real Hugging Face tokenizer, built at test time.

The tiny Llama of ``runtime/models/tiny-llama-a`` (2 layers, random weights), with:

- a byte-level BPE tokenizer trained here with the ``tokenizers`` library on a little text
  and JSON (its vocabulary is the model's), whose special tokens are the ones Qwen-style
  templates and vLLM's ``hermes`` tool parser and ``qwen3`` reasoning parser look for
  (``<|im_start|>``, ``<|im_end|>``, ``<tool_call>``, ``</tool_call>``, ``<think>``,
  ``</think>``);
- a chat template that renders tools the Qwen way (tests/fixtures/tiny-chat/), so vLLM's own
  rendering, structured outputs and parsers run on it exactly as on a real Qwen3.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "tiny-chat"
BASE = Path(__file__).resolve().parents[2] / "runtime" / "models" / "tiny-llama-a" / "config.json"
SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<tool_response>",
    "</tool_response>",
]
WORDS = [
    "the",
    "a",
    "to",
    "of",
    "and",
    "in",
    "is",
    "it",
    "you",
    "that",
    "for",
    "on",
    "with",
    "as",
    "this",
    "be",
    "are",
    "was",
    "file",
    "test",
    "code",
    "fix",
    "run",
    "list",
    "read",
    "write",
    "function",
    "arguments",
    "name",
    "path",
    "json",
    "value",
    "error",
    "true",
    "false",
    "null",
    "pattern",
    "command",
    "src",
    "tests",
    "recursive",
]


def _corpus() -> Iterator[str]:
    for i in range(300):
        yield " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(40))
        args = {"path": "src/x.py", "n": i, "ok": True}
        yield json.dumps({"name": WORDS[i % len(WORDS)], "arguments": args})
        yield '{"type": "object", "properties": {"path": {"type": "string"}}}'


def build_tiny_chat(out: Path) -> Path:
    """Write the model directory (config.json, tokenizer files, chat template) to ``out``."""
    import tokenizers
    import transformers

    out.mkdir(parents=True, exist_ok=True)
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=1024,
        special_tokens=SPECIALS,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(_corpus(), trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = (FIXTURE / "chat_template.jinja").read_text()
    fast.save_pretrained(str(out))
    config = json.loads(BASE.read_text())
    config.update(
        vocab_size=len(fast),
        eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=fast.convert_tokens_to_ids("<|endoftext|>"),
        bos_token_id=None,
    )
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out
