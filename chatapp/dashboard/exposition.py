"""/metrics: engine figures in Prometheus text format, named after vLLM's where one exists.

vLLM exports `vllm:prefix_cache_queries_total` etc.; ours are `prefixchat:...` with the
same meaning (tokens, not requests), labelled by engine so web process and workers
can be told apart, and by model (the alias /v1/models lists), so that each model's
figures add up across its engines: sum by (model) of a family is that model's total. Engines in other processes come from their last report in the
database; stale ones are left out (their series end, as a dead target's would).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from chatapp.dashboard import web_metrics
from chatapp.dashboard.selectors import engine_reports
from chatapp.dashboard.stats import IDENTITY

P = "prefixchat:"
ENGINE = ["engine", "model"]  # every engine family's labels

COUNTERS = (
    ("prefix_cache_queries", "prefix_cache_queries",
     "Prefix cache queries, in prompt tokens looked up."),
    ("prefix_cache_hits", "prefix_cache_hits", "Prefix cache hits, in tokens found cached."),
    ("num_preemptions", "preemptions", "Requests preempted (recomputed) for lack of KV blocks."),
    ("kv_cache_evictions", "evictions", "Cached KV blocks evicted to make room."),
    ("prefix_waits", "prefix_waits",
     "Admissions put off while another request computed the blocks they share."),
    ("inflight_shared_blocks", "inflight_shared_blocks",
     "KV blocks shared while the request computing them was still running."),
    ("prompt_tokens", "prompt_tokens_total", "Prompt tokens of finished requests."),
    ("generation_tokens", "generation_tokens_total", "Tokens generated."),
    ("prefix_cache_hits_tier", "prefix_cache_hits_tier",
     "Prefix cache hits restored from the host/disk KV tier, in tokens."),
    ("kv_tier_offloads", "kv_tier_offloads", "KV blocks copied to the host/disk tier."),
    ("kv_tier_restores", "kv_tier_restores", "KV blocks copied back from the tier."),
)
GAUGES = (
    ("num_requests_running", "num_running", "Requests running now."),
    ("num_requests_waiting", "num_waiting", "Requests waiting to be scheduled."),
    ("kv_cache_usage_perc", "kv_cache_usage", "Fraction of KV blocks in use (1 = full)."),
    ("kv_tier_memory_bytes", "kv_tier_memory_bytes", "Bytes of KV in the host memory tier."),
    ("kv_tier_disk_bytes", "kv_tier_disk_bytes", "Bytes of KV in the disk tier."),
)
HISTOGRAMS = (
    ("time_to_first_token_seconds", "ttft_seconds", "Time to first token."),
    ("inter_token_latency_seconds", "inter_token_latency_seconds", "Time between tokens."),
    ("e2e_request_latency_seconds", "e2e_request_latency_seconds", "Request latency, end to end."),
    ("kv_tier_restore_seconds", "kv_tier_restore_seconds",
     "Time to copy one lookup's blocks back from the host/disk tier."),
)


class EngineCollector:
    """Reads the engines at scrape time (no state of its own)."""

    def collect(self):
        reports = [((r.engine_id, str(r.snapshot.get("model") or "")), r.snapshot)
                   for r in engine_reports() if not r.stale]
        for kind, metrics in ((CounterMetricFamily, COUNTERS), (GaugeMetricFamily, GAUGES)):
            for name, key, doc in metrics:
                family = kind(P + name, doc, labels=ENGINE)
                for labels, snap in reports:
                    family.add_metric(list(labels), snap.get(key, 0) or 0)
                yield family
        # Info-style (value 1, facts in labels), as vLLM's cache_config_info: which kernel
        # path and dtypes each engine took, to explain its latency figures.
        info = GaugeMetricFamily(P + "engine_info",
                                 "The engine's model, kernel path and dtypes (always 1).",
                                 labels=[*ENGINE, "model_path", *IDENTITY])
        for labels, snap in reports:
            info.add_metric([*labels, str(snap.get("model_path") or snap.get("model") or ""),
                             *(str(snap.get(key) or "") for key in IDENTITY)], 1)
        yield info
        blocks = GaugeMetricFamily(P + "kv_cache_blocks", "KV blocks by state.",
                                   labels=[*ENGINE, "state"])
        for labels, snap in reports:
            for state in ("used", "cached_free", "free"):
                blocks.add_metric([*labels, state], snap.get(f"blocks_{state}", 0) or 0)
        yield blocks
        outcomes = CounterMetricFamily(P + "request_success",
                                       "Finished requests by how they ended.",
                                       labels=[*ENGINE, "finished_reason"])
        for labels, snap in reports:
            for reason, key in (("finished", "requests_finished"), ("error", "requests_failed"),
                                ("abort", "requests_aborted")):
                outcomes.add_metric([*labels, reason], snap.get(key, 0) or 0)
        yield outcomes
        reasons = CounterMetricFamily(P + "prefix_cache_match_end",
                                      "Requests by why their prefix-cache match ended.",
                                      labels=[*ENGINE, "reason"])
        for labels, snap in reports:
            for reason, n in (snap.get("prefix_cache_miss_reasons") or {}).items():
                reasons.add_metric([*labels, reason], n)
        yield reasons
        for name, key, doc in HISTOGRAMS:
            yield _histogram_family(name, key, doc, reports)


def _histogram_family(name: str, key: str, doc: str, reports) -> HistogramMetricFamily:
    family = HistogramMetricFamily(P + name, doc, labels=ENGINE)
    for labels, snap in reports:
        h = snap.get(key) or {}
        counts = list(h.get("cumulative_counts") or [])
        bounds = [repr(float(b)) for b in h.get("buckets") or []] + ["+Inf"]
        if not counts or len(bounds) != len(counts):
            continue
        family.add_metric(list(labels), list(zip(bounds, counts, strict=True)),
                          sum_value=h.get("sum", 0.0))
    return family


def metrics_text() -> bytes:
    """The whole exposition: engine metrics, then the web service's request metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector())
    return generate_latest(registry) + generate_latest(web_metrics.registry)
