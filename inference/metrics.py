"""Engine counters and latency histograms, read as one snapshot."""

from __future__ import annotations

import bisect
import threading
from collections import deque

# Buckets in seconds, close to vLLM's for the same metrics.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
# Copying one lookup's run of blocks back from the host/disk tier.
RESTORE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 0.5, 1.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0)


class Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # last = +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def snapshot(self) -> dict:
        cumulative, running = [], 0
        for c in self.counts:
            running += c
            cumulative.append(running)
        return {
            "buckets": list(self.buckets),
            "cumulative_counts": cumulative,  # the last entry is the +Inf bucket
            "sum": self.sum,
            "count": self.count,
        }


class EngineMetrics:
    """Written by the engine's step thread, read by anyone (under a lock)."""

    def __init__(self, recent: int = 256):
        self.lock = threading.Lock()
        self.ttft = Histogram(TTFT_BUCKETS)
        self.inter_token = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.requests_finished = 0
        self.requests_failed = 0
        self.requests_aborted = 0
        # Why each request's prefix match ended ("full", "evicted_pool", "evicted_tier",
        # "cold", "salt", "disabled"): see inference/miss_reason.py. Counts only: "salt"
        # (another tenant had computed the tokens) never appears in a request's receipt.
        self.prefix_cache_miss_reasons: dict[str, int] = {}
        # Recent finished requests: (prompt_tokens, cached_tokens, ttft).
        self.recent: deque[dict] = deque(maxlen=recent)

    def record_finished(self, info: dict, reason_label: str | None = None) -> None:
        """info joins the recent per-request rows; reason_label only the aggregate counts."""
        with self.lock:
            self.recent.append(info)
            reason = info.get("finish_reason")
            if reason == "abort":
                self.requests_aborted += 1
            elif reason == "error":
                self.requests_failed += 1
            else:
                self.requests_finished += 1
            if reason_label is not None:
                self.prefix_cache_miss_reasons[reason_label] = (
                    self.prefix_cache_miss_reasons.get(reason_label, 0) + 1)
            if info.get("e2e") is not None:
                self.e2e.observe(info["e2e"])
