"""``parent_kv``: whether a sub-agent's parent has the prompt's shared prefix on the instance.

A child session (a sub-agent) starts with its parent's system prompt and tools: an engine with
prefix caching (vLLM's, the simulated one: runtime/engines/sim_kv.py) reuses the parent's KV
for those tokens when the child runs where the parent's KV is. The score is in the unit of
``kv_locality`` (the fraction of the call's prefill that reuse saves), so the two add up to
what the instance saves this call and weigh alike.
"""

from __future__ import annotations

from talaria.core.routing.request import RouteRequest
from talaria.core.routing.scorers.base import Scorer, label, unit
from talaria.core.routing.settings import RoutingConfig
from talaria.core.status import InstanceStatus


def parent_kv(request: RouteRequest, status: InstanceStatus, config: RoutingConfig) -> float:
    """``min(parent_prefix_tokens, parent's KV tokens) / prompt_tokens`` × where the parent's
    KV is (HBM → 1; host memory → ``1 − restore_s / recompute_s``, clamped) when the parent's
    KV for this model is on the instance and the session has none of its own here; else 0
    (no parent, nothing shared, the parent's KV absent or of another model, or the session's
    own KV here, which holds the prefix already and ``kv_locality`` scores)."""
    if request.parent_key is None or request.parent_prefix_tokens <= 0:
        return 0.0
    own = status.sessions.get(request.session_key)
    if own is not None and own.model == request.model and own.tokens > 0:
        return 0.0
    kv = status.sessions.get(request.parent_key)
    if kv is None or kv.model != request.model or kv.tokens <= 0:
        return 0.0
    share = min(request.parent_prefix_tokens, kv.tokens) / max(1, request.prompt_tokens)
    if kv.location == "hbm":
        return unit(share)
    if kv.recompute_s <= 0.0:
        return 0.0
    return unit(share * (1.0 - kv.restore_s / kv.recompute_s))


SCORER = Scorer(parent_kv, label("kv-parent"))
