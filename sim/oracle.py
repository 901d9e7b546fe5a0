"""The oracle bound: each session alone on its own node, its model resident, no queueing.

    SCT_oracle = Σ_i [call_overhead + prefill_time(p_i − c_i, c_i)
                      + decode_time(o_i − 1, p_i, batch 1)] + Σ gaps,

where c_i is the prefix reused from HBM (whole blocks of the previous prompt + output, never
the last prompt token) and the prefill step samples the first output token. It is what the
simulated engine itself takes for a lone session, so every replayed SCT is ≥ its oracle.
"""

from __future__ import annotations

from talaria.core.trace import SessionTrace
from talaria.runtime.costmodel import CostModel


def oracle_sct_s(session: SessionTrace, cost: CostModel) -> float:
    """The session's oracle SCT, seconds (the module docstring's sum)."""
    block = cost.profile.block_tokens
    total = 0.0
    previous = 0
    for call in session.calls:
        shared = call.prompt_tokens - call.new_tokens
        cached = min(shared, previous, call.prompt_tokens - 1)
        cached = max(0, cached - cached % block)
        total += cost.call_overhead_s() + cost.prefill_time_s(call.prompt_tokens - cached, cached)
        total += cost.decode_time_s(call.output_tokens - 1, call.prompt_tokens, 1)
        total += call.tool_gap_s or 0.0
        previous = call.prompt_tokens + call.output_tokens
    return total
