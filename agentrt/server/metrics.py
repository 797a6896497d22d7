"""`/metrics`: Prometheus text from a registry owned by one server (no process-global state).

Request counters and latency histograms are updated by the handlers; engine figures (queue
depth, KV occupancy, cache hit rate, sessions, step time) are read from `Engine.stats()` at
scrape time by a collector.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from agentrt.engine.reads import EngineReads

_LATENCY = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _EngineCollector:
    def __init__(self, state) -> None:
        self.state = state

    def collect(self):
        backends = self.state.backends
        if backends is None:
            return
        yield GaugeMetricFamily("agentrt_routed_sessions", "conversation sessions the server routes",
                                value=backends.sessions)
        yield GaugeMetricFamily("agentrt_replicas_live", "engines (replicas) running", value=len(backends.live()))
        engine = self.state.engine
        if not isinstance(engine, EngineReads):  # a Ray replica: its engine's figures live in its process
            return
        st = engine.stats()
        gauges = {
            "agentrt_queue_depth": ("requests waiting for admission", st.waiting),
            "agentrt_running_requests": ("requests in the running batch", st.running),
            "agentrt_engine_sessions": ("KV sessions open in the engine", st.sessions),
            "agentrt_kv_occupancy": ("fraction of KV pages in use", st.kv_occupancy),
            "agentrt_cache_hit_rate": ("prompt tokens served from KV already held / prompt tokens", st.hit_rate),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(name, doc, value=value)
        counters = {
            "agentrt_engine_steps": ("model steps run", st.steps),
            "agentrt_engine_step_seconds": ("wall time of the model steps", st.step_seconds),
            "agentrt_engine_prompt_tokens": ("prompt tokens submitted to the engine", st.prompt_submitted),
            "agentrt_engine_cached_prompt_tokens": ("prompt tokens served from KV already held", st.prompt_cached),
            "agentrt_engine_decode_tokens": ("tokens decoded", st.decode_tokens),
            "agentrt_engine_admissions": ("requests admitted to run (re-admissions after a preemption too)",
                                          st.admissions),
            "agentrt_engine_preemptions": ("requests preempted for KV room", st.preemptions),
        }
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(name, doc, value=value)


class Metrics:
    """One server's metrics."""

    def __init__(self, state) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("agentrt_requests", "HTTP API requests", ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("agentrt_prompt_tokens", "prompt tokens of answered requests", registry=r)
        self.cached_tokens = Counter("agentrt_cached_tokens", "of those, served from KV already held", registry=r)
        self.completion_tokens = Counter("agentrt_completion_tokens", "completion tokens", registry=r)
        self.ttft = Histogram("agentrt_time_to_first_token_seconds", "request arrival to its first token",
                              buckets=_LATENCY, registry=r)
        self.latency = Histogram("agentrt_request_seconds", "request arrival to its last token", buckets=_LATENCY,
                                 registry=r)
        r.register(_EngineCollector(state))

    def usage(self, usage) -> None:
        if usage is not None:
            self.prompt_tokens.inc(usage.prompt_tokens)
            self.cached_tokens.inc(usage.cached_tokens)
            self.completion_tokens.inc(usage.completion_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
