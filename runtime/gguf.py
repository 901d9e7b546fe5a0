"""A GGUF file as a Hugging Face model directory that vLLM's CPU build loads.

vLLM reads GGUF only through its GPU quantization kernels; its CPU build wants a directory of
``config.json``, tokenizer files and safetensors weights. ``transformers`` reads a GGUF file's
config, tokenizer and weights (``gguf_file=``; it needs the ``gguf`` package, and
``accelerate`` to load) and dequantizes the weights to float32; ``save_pretrained`` then writes
the directory once the GGUF quantization marker is removed from the config (it refuses to save
a model it believes quantized). docs/sources.md §6 has the measured sizes: SmolLM2-135M's
98 MB Q4_1 file becomes 538 MB of float32 safetensors in about 30 s on 2 cores.

The directory gets a chat template: the file's own if it renders tools, else ``template``
(default: runtime/templates/chatml-tools.jinja, which renders tools and tool results in the
Hermes format vLLM's ``hermes`` parser reads). A GGUF file's own template (SmolLM2's) often
renders neither tools nor an assistant turn whose content is null.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from talaria.runtime.engines.tokenizer import HFTokenizer, tool_template_fault

TEMPLATES = Path(__file__).resolve().parent / "templates"
TOOLS_TEMPLATE = TEMPLATES / "chatml-tools.jinja"
"""The project's ChatML template with Hermes tool calls (see its header)."""
MARKER = ".talaria-gguf.json"
"""Written last into a converted directory: what it was converted from (a half-written
directory has none and is converted again)."""


class GgufError(RuntimeError):
    """A GGUF file that cannot be converted (missing packages, unreadable file)."""


def cache_root() -> Path:
    """Where converted directories live: ``$TALARIA_MODEL_CACHE``, else
    ``$XDG_CACHE_HOME/talaria/models``, else ``~/.cache/talaria/models``."""
    explicit = os.environ.get("TALARIA_MODEL_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "talaria" / "models"


def model_name(gguf: Path) -> str:
    """The served name of a GGUF file: its stem, lower case, without a quantization suffix
    (``SmolLM2-135M-Instruct.Q4_1.gguf`` → ``smollm2-135m-instruct``)."""
    stem = gguf.name.removesuffix(".gguf")
    head, dot, tail = stem.rpartition(".")
    if dot and tail.upper().startswith(("Q", "F16", "F32", "BF16", "IQ")):
        stem = head
    return stem.lower()


def _digest(gguf: Path) -> str:
    """The file's identity for the cache: SHA-256 of its bytes, 12 hex digits."""
    h = hashlib.sha256()
    with gguf.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:12]


def converted_dir(gguf: Path, out: Path | None = None, template: Path | None = None) -> Path:
    """The Hugging Face directory of ``gguf``: ``out`` if given, else one under
    :func:`cache_root` named by the file's name and digest; converted if it is not there yet
    (see the module docstring)."""
    gguf = gguf.resolve()
    if not gguf.is_file():
        raise GgufError(f"no GGUF file {gguf}")
    target = out or cache_root() / f"{model_name(gguf)}-{_digest(gguf)}"
    marker = target / MARKER
    if marker.is_file():
        _refresh_template(target, json.loads(marker.read_text()))
        return target
    convert(gguf, target, template)
    return target


def _refresh_template(target: Path, marker: dict[str, object]) -> None:
    """A directory converted with the project's tools template gets its current text: a
    cached conversion would otherwise keep an older copy, which runtime/model_source.py no
    longer recognises as ours (and serves without the ``hermes`` tool parser)."""
    if marker.get("template") != "ours":
        return
    own = target / "chat_template.jinja"
    current = TOOLS_TEMPLATE.read_text()
    if not own.is_file() or own.read_text() != current:
        own.write_text(current)


def convert(gguf: Path, target: Path, template: Path | None = None) -> None:
    """Write the Hugging Face directory of ``gguf`` into ``target`` (replacing what is there)."""
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:  # pragma: no cover - the vLLM environment has both
        raise GgufError(f"converting a GGUF file needs torch and transformers: {exc}") from exc
    for package in ("gguf", "accelerate"):
        try:
            __import__(package)
        except ImportError as exc:
            raise GgufError(
                f"converting a GGUF file needs the {package!r} package "
                "(bash scripts/vllm-venv.sh installs it)"
            ) from exc
    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config  # else save_pretrained refuses
    vars(model)["hf_quantizer"] = None  # a plain attribute (torch's stubs type it a Module)
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    origin = None
    if tool_template_fault(HFTokenizer(tokenizer)) is not None:
        chosen = template or TOOLS_TEMPLATE
        (partial / "chat_template.jinja").write_text(chosen.read_text())
        origin = "ours" if template is None else str(template)
    (partial / MARKER).write_text(
        json.dumps({"gguf": str(gguf), "digest": _digest(gguf), "template": origin})
    )
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
