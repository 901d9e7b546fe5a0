"""Building a ``VLLMEngine``: the engine arguments, the model's config and weight size, and the
tiny random-weight test models shipped with the package."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from talaria.core.clock import Clock
from talaria.runtime.costmodel import CostModel
from talaria.runtime.engines.timing import RateModel
from talaria.runtime.engines.tokenizer import (
    TEXT_IDS,
    ByteTokenizer,
    HFTokenizer,
    Tokenizer,
    has_tokenizer_files,
    load_tokenizer,
)
from talaria.runtime.engines.vllm.adapter import AsyncLLMLike, sleep_mode_available
from talaria.runtime.engines.vllm.engine import VLLMEngine
from talaria.runtime.engines.vllm.kv import KvShape
from talaria.runtime.engines.vllm.options import ChatOptions, VLLMEngineOptions

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


def _read_config(model_dir: str | Path) -> dict[str, Any]:
    """The model's ``config.json``: from a local directory, else from the Hugging Face cache
    (``huggingface_hub``, which honours ``HF_HUB_OFFLINE``)."""
    path = Path(model_dir)
    if path.is_dir():
        data: dict[str, Any] = json.loads((path / "config.json").read_text())
        return data
    from huggingface_hub import hf_hub_download

    return dict(json.loads(Path(hf_hub_download(str(model_dir), "config.json")).read_text()))


NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
"""x86 CPU flags (``/proc/cpuinfo``) of native bfloat16 arithmetic, the ones vLLM's CPU
backend checks (``torch.cpu._is_avx512_bf16_supported``, ``_is_amx_tile_supported``)."""


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU computes in bfloat16 natively: a ``NATIVE_BF16_FLAGS`` flag in
    ``cpuinfo`` (default: ``/proc/cpuinfo``); True where that cannot be read, so nothing changes
    on a machine this cannot tell about. Without it, PyTorch emulates bf16 matrix products, ~50×
    slower than float32 (docs/sources.md §6)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return True
    flags = {f for line in cpuinfo.splitlines() if line.startswith("flags") for f in line.split()}
    return not flags or bool(flags & NATIVE_BF16_FLAGS)


def has_weights(model_dir: str | Path) -> bool:
    path = Path(model_dir)
    if not path.is_dir():
        return True  # a repo id: vLLM downloads or finds the weights
    return any(p.name.endswith(WEIGHT_SUFFIXES) for p in path.iterdir())


def weight_bytes_from_index(model_dir: str | Path) -> float | None:
    """Total weight bytes from ``model.safetensors.index.json`` (``metadata.total_size``)."""
    index = Path(model_dir) / "model.safetensors.index.json"
    if not index.is_file():
        return None
    size = json.loads(index.read_text()).get("metadata", {}).get("total_size")
    return float(size) if isinstance(size, int | float) else None


def _nvml_min_bytes(devices: Sequence[int], field: str) -> float:
    """The smallest ``field`` (``free`` or ``total``) of the memory of ``devices`` (NVML
    indices), via ``pynvml`` (``nvidia-ml-py``, a vLLM dependency on CUDA); 0 for no devices.
    Unverified here (no GPU on the dev machine)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in devices]
        values = [float(getattr(pynvml.nvmlDeviceGetMemoryInfo(h), field)) for h in handles]
    finally:
        pynvml.nvmlShutdown()
    return min(values) if values else 0.0


def nvml_free_bytes(devices: Sequence[int]) -> Callable[[], float]:
    """A probe of the smallest free memory over ``devices``."""
    return lambda: _nvml_min_bytes(devices, "free")


def nvml_total_bytes(devices: Sequence[int]) -> float | None:
    """The smallest total memory over ``devices``; None when NVML is not there."""
    try:
        return _nvml_min_bytes(devices, "total") or None
    except Exception:
        return None


def vllm_engine_args(
    model_dir: str | Path,
    *,
    sleep_mode: bool,
    max_model_len: int,
    served_name: str | None = None,
    native_bf16: bool = True,
    **engine_args: Any,
) -> dict[str, Any]:
    """``AsyncEngineArgs`` fields for one engine: prefix caching and priority scheduling;
    vLLM's own tokenizer for a model that has one (its chat calls go through vLLM's serving
    layer, served as ``served_name``), else our own tokenization (``skip_tokenizer_init``: the
    tiny test models' byte tokenizer); random weights (``load_format="dummy"``) for a directory
    holding only ``config.json``; sleep mode on the GPU path, eager mode on the CPU path, and
    there float32 weights where the CPU has no native bfloat16 (``native_bf16``, see
    ``cpu_has_native_bf16``) (docs/sources.md §6). ``engine_args`` override any of them."""
    own_tokenizer = Path(model_dir).is_dir() and not has_tokenizer_files(model_dir)
    args: dict[str, Any] = {
        "model": str(model_dir),
        "skip_tokenizer_init": own_tokenizer,
        "enable_prefix_caching": True,
        "scheduling_policy": "priority",
        "max_model_len": max_model_len,
    }
    if not own_tokenizer and served_name is not None:
        args["served_model_name"] = [served_name]
    if not has_weights(model_dir):
        args["load_format"] = "dummy"
    if sleep_mode:
        args["enable_sleep_mode"] = True
    else:
        args["enforce_eager"] = True
        if not native_bf16:
            args["dtype"] = "float32"
    args.update(engine_args)
    return args


def build_vllm_engine(
    model_dir: str | Path,
    name: str,
    clock: Clock,
    node: str,
    *,
    sleep_mode: bool | None = None,
    sleep_level: int = 1,
    max_model_len: int = 2048,
    rates: RateModel | Mapping[str, float] | None = None,
    ignore_eos: bool | None = None,
    tokenizer: Tokenizer | None = None,
    host_kv_survives_sleep: bool | None = None,
    weight_bytes_per_device: float | None = None,
    free_device_bytes: Callable[[], float] | None = None,
    device_bytes: float | None = None,
    sampling: Mapping[str, Any] | None = None,
    cost: CostModel | None = None,
    tool_parser: str | None = None,
    reasoning_parser: str | None = None,
    tool_strict_level: str = "parameter",
    chat_template: str | None = None,
    **engine_args: Any,
) -> VLLMEngine:
    """A ``VLLMEngine`` for ``model_dir`` (not started: ``await engine.start()``, one engine at
    a time). ``sleep_mode=None`` asks vLLM's platform (GPU: sleep mode; CPU: the gate).
    ``sleep_level`` 2 discards the weights at each sleep and reloads them from ``model_dir``
    at the wake (no pinned host copy; switching.py).
    ``rates`` may be a mapping of ``RateModel`` fields (a node TOML's ``rates = {...}``).
    ``engine_args`` go to ``AsyncEngineArgs`` (``tensor_parallel_size``,
    ``gpu_memory_utilization``, ``kv_offloading_size``, ``kv_offloading_backend``, ...).
    With the byte tokenizer (the tiny models) the output is restricted to ``TEXT_IDS`` unless
    ``sampling`` sets ``allowed_token_ids``. A model with a Hugging Face tokenizer serves
    chat calls through vLLM's serving layer, with ``tool_parser``, ``reasoning_parser``,
    ``tool_strict_level`` and ``chat_template`` as ``vllm serve`` takes them; Talaria's own
    prompt counts use the same template. ``tool_strict_level`` defaults to ``parameter``
    (``vllm serve``'s is ``auto``): with ``auto`` a named or ``required`` tool choice holds
    only the call's envelope to its schema, and a small model's arguments then often do not
    parse (issue 26: SmolLM2-135M's did not).

    On the CPU path ``VLLM_CPU_KVCACHE_SPACE`` defaults to 1 (GiB of KV cache per engine) if
    unset. Offline use of a local directory wants ``HF_HUB_OFFLINE=1`` (set by the caller).
    """
    gpu = sleep_mode_available() if sleep_mode is None else sleep_mode
    if not gpu:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    tp = int(engine_args.get("tensor_parallel_size", 1))
    args = vllm_engine_args(
        model_dir,
        sleep_mode=gpu,
        max_model_len=max_model_len,
        served_name=name,
        native_bf16=gpu or cpu_has_native_bf16(),
        **engine_args,
    )
    config = _read_config(model_dir)
    shape = KvShape.from_config(
        config,
        block_tokens=int(args.get("block_size") or 16),
        tensor_parallel_size=tp,
        kv_cache_dtype=str(args.get("kv_cache_dtype", "auto")),
    )
    dummy = args.get("load_format") == "dummy"
    if weight_bytes_per_device is None and gpu:
        total = weight_bytes_from_index(model_dir) if Path(model_dir).is_dir() else None
        weight_bytes_per_device = total / tp if total is not None else None
    if free_device_bytes is None and gpu:
        free_device_bytes = nvml_free_bytes(range(tp))
    if device_bytes is None and gpu:
        device_bytes = nvml_total_bytes(range(tp))
    if host_kv_survives_sleep is None:
        host_kv_survives_sleep = args.get("kv_offloading_backend") == "lmcache"
    tokenizer = tokenizer or load_tokenizer(model_dir, chat_template)
    sampling = dict(sampling or {})
    if isinstance(tokenizer, ByteTokenizer):
        # random weights: keep the output printable, so that it round-trips (tokenizer.py)
        sampling.setdefault("allowed_token_ids", list(TEXT_IDS))
    chat = None
    if not isinstance(tokenizer, ByteTokenizer):
        special = tokenizer.special_tokens if isinstance(tokenizer, HFTokenizer) else ()
        chat = ChatOptions(
            str(model_dir),
            tool_parser,
            reasoning_parser,
            tool_strict_level,
            chat_template,
            special_tokens=special,
        )
    options = VLLMEngineOptions(
        sleep_mode=gpu,
        sleep_level=sleep_level,
        max_model_len=max_model_len,
        ignore_eos=dummy if ignore_eos is None else ignore_eos,
        rates=rates if isinstance(rates, RateModel) else RateModel(**(rates or {})),
        host_kv_survives_sleep=host_kv_survives_sleep,
        weight_bytes_per_device=weight_bytes_per_device,
        free_device_bytes=free_device_bytes,
        device_bytes=device_bytes,
        memory_share=float(args.get("gpu_memory_utilization", 0.9)),
        sampling=sampling,
        cost=cost,
        chat=chat,
    )

    def make() -> AsyncLLMLike:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        llm: AsyncLLMLike = AsyncLLM.from_engine_args(AsyncEngineArgs(**args))
        return llm

    async def factory() -> AsyncLLMLike:
        # from_engine_args blocks while the EngineCore process starts: keep the loop free.
        return await asyncio.to_thread(make)

    return VLLMEngine(
        name,
        factory,
        clock,
        node,
        kv_shape=shape,
        tokenizer=tokenizer,
        options=options,
    )


MODELS_DIR = Path(__file__).resolve().parents[2] / "models"
"""The tiny random-weight test models shipped with the package (``tiny-llama-a``, ``-b``)."""


def tiny_model_dir(name: str) -> Path:
    """The directory of a shipped tiny model, e.g. ``tiny_model_dir("tiny-llama-a")``."""
    path = MODELS_DIR / name
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no tiny model {name!r} in {MODELS_DIR}")
    return path
