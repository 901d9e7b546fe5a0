"""``load_tokenizer`` on a model directory with tokenizer files: the ``transformers`` path.

A tiny byte-level BPE tokenizer with a chat template is trained and saved here (offline), then
loaded the way a real model directory's tokenizer is (``transformers`` comes with vLLM).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from talaria.runtime.engines.tokenizer import HFTokenizer, IncrementalDecoder, load_tokenizer

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

pytestmark = pytest.mark.vllm

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(["hello world, please fix the failing test"] * 10, trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<s>", eos_token="</s>"
    )
    fast.chat_template = TEMPLATE
    path = tmp_path_factory.mktemp("hf-model")
    fast.save_pretrained(str(path))
    (path / "config.json").write_text("{}")
    return path


def test_transformers_tokenizer_and_its_chat_template(model_dir: Path) -> None:
    tok = load_tokenizer(model_dir)
    assert isinstance(tok, HFTokenizer)
    assert tok.eos_token_id == 1
    messages = [{"role": "user", "content": "hello world"}]
    assert tok.render_chat(messages) == "<s><|user|>\nhello world\n<|assistant|>\n"
    ids = tok.encode_chat(messages)
    assert ids[0] == 0 and ids.count(0) == 1  # bos from the template, not added twice
    assert tok.decode(ids) == "<|user|>\nhello world\n<|assistant|>\n"  # specials skipped
    follow = [*messages, {"role": "assistant", "content": "fix"}, {"role": "user", "content": "ok"}]
    head = tok.encode_chat(messages)
    assert tok.encode_chat(follow)[: len(head)] == head  # this template is prefix-stable too
    decoder = IncrementalDecoder(tok)
    text = "".join(decoder.push([i]) for i in tok.encode("please fix the test")) + decoder.finish()
    assert text == "please fix the test"
