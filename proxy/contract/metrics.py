"""Prometheus metrics of one proxy (its own registry: several apps in one process stay apart)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)
SCT_BUCKETS_S = (1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)


OVERHEAD_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)
"""The proxy's own time per request: half a millisecond (a small call, docs/proxy-overhead.md)
to a second (a store commit stalled)."""


class ProxyMetrics:
    """The proxy's Prometheus counters, gauges and histograms (seconds, tokens), in a registry
    of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "talaria_requests", "HTTP responses by route (path template) and status",
            ["route", "status"],
            registry=r,
        )  # fmt: skip
        self.overhead = Histogram(
            "talaria_proxy_overhead_seconds",
            "Time a request spent in the proxy, not in a runtime (x-talaria-overhead-ms), by "
            "route", ["route"], buckets=OVERHEAD_BUCKETS_S, registry=r,
        )  # fmt: skip
        self.call_latency = Histogram(
            "talaria_call_latency_seconds", "Arrival to last token of an LLM call", ["model"],
            buckets=LATENCY_BUCKETS_S, registry=r,
        )  # fmt: skip
        self.ttft = Histogram(
            "talaria_ttft_seconds", "Arrival to first token", ["model"],
            buckets=LATENCY_BUCKETS_S, registry=r,
        )  # fmt: skip
        self.sct = Histogram(
            "talaria_session_completion_seconds", "First call's arrival to the session's end",
            ["model"], buckets=SCT_BUCKETS_S, registry=r,
        )  # fmt: skip
        self.decisions = Counter(
            "talaria_routing_decisions", "Routing decisions by reason", ["router", "reason"],
            registry=r,
        )  # fmt: skip
        self.preferences = Counter(  # route preferences, exported under their old name
            "talaria_reservations",
            "Soft reservations by outcome: taken, hit (returned to the reserved instance), "
            "miss (returned elsewhere), expired, ended",
            ["outcome"], registry=r,
        )  # fmt: skip
        self.prompt_tokens = Counter(
            "talaria_prompt_tokens", "Prompt tokens of finished calls", registry=r
        )
        self.cached_tokens = Counter(
            "talaria_cached_tokens", "Prompt tokens served from a prefix cache", registry=r
        )
        self.kv_hit_ratio = Gauge(
            "talaria_kv_hit_ratio", "cached_tokens / prompt_tokens since start", registry=r
        )
        self.sessions_found = Counter(
            "talaria_session_calls",
            "Calls by how their session was found: new, continued (its conversation extended a "
            "thread of a live session), retry, corrected, drifted, thread and compacted (a new "
            "conversation of a named session), child (a sub-session a request named), adopted "
            "(the first call of a session taken over from another replica)",
            ["how"], registry=r,
        )  # fmt: skip
        self.prefix_drift = Counter(
            "talaria_prefix_drift",
            "Calls that repeated a thread's prompt with a message or two rewritten, so the KV "
            "after the first could not be reused (proxy/sessions/drift.py)",
            registry=r,
        )
        self.live_sessions = Gauge("talaria_live_sessions", "Sessions in memory", registry=r)
        self.writer_pending = Gauge(
            "talaria_store_pending_records", "Records waiting for the batched writer", registry=r
        )

    def tokens(self, prompt: int, cached: int) -> None:
        """Count a finished call's prompt and cached tokens, and set the KV hit ratio:
        Σ cached / Σ prompt since start."""
        self.prompt_tokens.inc(prompt)
        self.cached_tokens.inc(cached)
        total = self.prompt_tokens._value.get()
        if total > 0:
            self.kv_hit_ratio.set(self.cached_tokens._value.get() / total)

    def render(self) -> bytes:
        """The registry in Prometheus' text exposition format (the body of /metrics)."""
        return generate_latest(self.registry)
