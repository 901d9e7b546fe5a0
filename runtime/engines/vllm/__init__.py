"""VLLMEngine: the ``Engine`` seam over one vLLM ``AsyncLLM`` (V1; its EngineCore runs in a
process of its own).

Modules, one responsibility each: ``adapter`` (the boundary with vLLM), ``switching`` (the sleep
/ wake state machine), ``kv`` (KV sizing and prefix prediction), ``chat`` (a chat call rendered,
sampled and parsed by vLLM's own OpenAI serving layer), ``engine`` (``VLLMEngine``), ``build``
(engine arguments and the builder).

vLLM is imported lazily, only by ``build_vllm_engine``'s factory and the default ``VllmApi``:
this module imports without vLLM, and tests pass a fake engine (``engine_factory``) and a fake
``api``. Two paths, chosen once at construction (``sleep_mode``):

**GPU path (sleep mode).** The engine is built with ``enable_sleep_mode=True``,
``enable_prefix_caching=True`` and ``scheduling_policy="priority"``, and put to sleep right
after it starts (``start``), so the next engine's start finds the memory free (vLLM checks free
memory at start: start engines one at a time, awaiting each ``start``).

- ``deactivate``: only with nothing running (the scheduler drains first; checked), then
  ``sleep(level)``, the KV cache discarded. Level 1 (the default) copies the weights to pinned
  host memory and always keeps them there, so ``keep_host_weight_copy`` changes nothing here;
  level 2 (``VLLMEngineOptions.sleep_level``, a node TOML's ``sleep_level = 2``) discards
  them, the engine staying initialised.
- ``activate``: ``wake_up()`` — weights *and* ``kv_cache`` (waking only the weights leaves
  vLLM paused: the pitfall of docs/sources.md §5). After staging, only
  ``wake_up(tags=["kv_cache"])``. After a level-2 sleep the weights are reallocated and
  reloaded from the model's files first (``collective_rpc("reload_weights")``, switching.py).
- ``start_staging``: if the weights fit in the free device memory now (``free_device_bytes``
  ≥ ``weight_bytes_per_device``), ``wake_up(tags=["weights"])`` in the background; vLLM stays
  paused until ``kv_cache`` is woken too. ``cancel_staging`` puts the weights back to sleep.
  All wake/sleep calls are serialised; each converges the engine on the wanted state.
- Host KV: vLLM's KV offloading (``kv_offloading_size`` + ``kv_offloading_backend``, the
  OffloadingConnector) writes prompt blocks to a host tier that a later call with the same
  prefix reloads. In vLLM 0.32.0 (read in its source, not run on a GPU here)
  ``sleep(level>=1)`` ends in ``reset_prefix_cache(reset_running_requests=True,
  reset_connector=True)``: the *native* backend's ``reset_cache`` evicts its whole CPU tier,
  so session KV does not survive a switch; the LMCache connectors do not implement
  ``reset_cache`` (a no-op), so an LMCache store survives. ``host_kv_survives_sleep`` tells
  the engine which holds (``build_vllm_engine`` sets it for ``kv_offloading_backend="lmcache"``).
  ``keep_kv_on_host`` cannot change what vLLM does at sleep; it is recorded only.

**CPU path (no sleep mode).** vLLM's CPU backend has no sleep mode, so every engine stays
resident and switching is a logical gate: ``activate`` / ``deactivate`` open and close it and
take ~0 s. This does not measure switch cost; the scheduler's decisions (slots, admission, SP
budgets) are the same as on a GPU. KV stays in each engine's CPU KV cache across switches, so a
returning session finds its prefix cached (reported as ``KvSource.HBM``).

**Cached tokens and ``KvSource``.** vLLM reports ``RequestOutput.num_cached_tokens`` (local
prefix-cache hits + tokens loaded by a KV connector, not told apart). The engine counts its
sleeps (``epoch``): cached tokens > 0 in the same epoch as the session's previous call are
``HBM``; after a sleep they can only have come from a host tier (``HOST``); none are ``NEW``
for a session's first call and ``RECOMPUTE`` afterwards.

``session_kv()`` (the ``OwnKv`` capability) is the engine's best-effort view of which sessions'
KV it still holds (vLLM's KV is not in ``NodeMemory``); the node's status lists those of its
live sessions, so the proxy's KV-locality routing sees them.

**Memory.** vLLM owns its KV memory (a block pool sized at start by
``gpu_memory_utilization``) and preempts when it runs out, so ``try_admit`` admits whenever the
engine is active, and the engine has no ``MemoryAccounting``: the node never keeps a call or a
switch waiting for memory on its behalf. Its ``kv_shape`` is still exact (from the model
config), for the results' restored bytes.

**Timing estimates** come from the calibrated ``CostModel`` when the node's profile has a fit
for the model (``talaria calibrate``; the simulator then estimates exactly as the live engine
does), else from ``RateModel``, a per-token rate model with rough defaults.
"""

from __future__ import annotations

from talaria.runtime.engines.priorities import PRIORITY_DEFAULT, PRIORITY_SP, vllm_priority
from talaria.runtime.engines.timing import RateModel
from talaria.runtime.engines.vllm.build import (
    MODELS_DIR,
    build_vllm_engine,
    cpu_has_native_bf16,
    has_weights,
    tiny_model_dir,
    vllm_engine_args,
    weight_bytes_from_index,
)
from talaria.runtime.engines.vllm.engine import VLLMEngine
from talaria.runtime.engines.vllm.kv import KvShape
from talaria.runtime.engines.vllm.options import VLLMEngineOptions

__all__ = [
    "MODELS_DIR",
    "PRIORITY_DEFAULT",
    "PRIORITY_SP",
    "KvShape",
    "RateModel",
    "VLLMEngine",
    "VLLMEngineOptions",
    "build_vllm_engine",
    "cpu_has_native_bf16",
    "has_weights",
    "tiny_model_dir",
    "vllm_engine_args",
    "vllm_priority",
    "weight_bytes_from_index",
]
