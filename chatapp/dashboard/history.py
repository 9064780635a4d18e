"""Time series from the sample table: hit rate, block usage and TTFT over an hour or a day.

Samples hold cumulative counters; a point is the change between consecutive samples
of one engine (a counter that went down means the engine restarted: the new value is
the change). Changes fall into fixed time buckets and add up across engines, so the
total is a true token-weighted rate, not an average of rates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.utils import timezone

from chatapp.dashboard import stats
from chatapp.dashboard.models import EngineSample

# range name -> (span, bucket width)
RANGES = {
    "hour": (timedelta(hours=1), timedelta(seconds=30)),
    "day": (timedelta(days=1), timedelta(minutes=10)),
}


@dataclass
class _Bucket:
    queries: int = 0
    hits: int = 0
    ttft_counts: list[int] = field(default_factory=list)
    ttft_buckets: list[float] = field(default_factory=list)
    # engine -> (used, cached_free, total) of its last sample in the bucket
    blocks: dict[str, tuple[int, int, int]] = field(default_factory=dict)


def _delta(now: int, before: int) -> int:
    return now - before if now >= before else now


def _add_counts(into: list[int], counts: list[int]) -> list[int]:
    if not into:
        return list(counts)
    if len(into) != len(counts):  # engines with other buckets: keep the first layout
        return into
    return [a + b for a, b in zip(into, counts, strict=True)]


def series(*, range_name: str = "hour", engine_id: str | None = None,
           now: datetime | None = None) -> dict:
    """Points per bucket: {"t": [...], "hit_rate": [...], "kv_usage": [...],
    "cached_free": [...], "ttft_p50": [...], "ttft_p95": [...]} (None where no data)."""
    span, width = RANGES.get(range_name, RANGES["hour"])
    now = now or timezone.now()
    start = now - span
    n = int(span / width)
    buckets = [_Bucket() for _ in range(n)]
    qs = EngineSample.objects.filter(taken_at__gte=start - width, taken_at__lte=now)
    if engine_id:
        qs = qs.filter(engine_id=engine_id)
    previous: dict[str, EngineSample] = {}
    for s in qs.order_by("taken_at", "id").iterator():
        prev = previous.get(s.engine_id)
        previous[s.engine_id] = s
        if s.taken_at < start:
            continue  # only the baseline for the first change
        b = buckets[min(n - 1, int((s.taken_at - start) / width))]
        b.blocks[s.engine_id] = (s.blocks_used, s.blocks_cached_free, s.blocks_total)
        if prev is None:
            continue
        b.queries += _delta(s.prefix_cache_queries, prev.prefix_cache_queries)
        b.hits += _delta(s.prefix_cache_hits, prev.prefix_cache_hits)
        if s.ttft_counts and len(s.ttft_counts) == len(prev.ttft_counts):
            changes = [_delta(a, b_) for a, b_ in zip(s.ttft_counts, prev.ttft_counts, strict=True)]
            b.ttft_counts = _add_counts(b.ttft_counts, changes)
            b.ttft_buckets = b.ttft_buckets or list(s.ttft_buckets)
    out: dict[str, list] = {k: [] for k in
                            ("t", "hit_rate", "kv_usage", "cached_free", "ttft_p50", "ttft_p95")}
    for i, b in enumerate(buckets):
        out["t"].append((start + width * (i + 1)).isoformat())
        out["hit_rate"].append(stats.ratio(b.hits, b.queries))
        total = sum(t for _, _, t in b.blocks.values())
        out["kv_usage"].append(stats.ratio(sum(u for u, _, _ in b.blocks.values()), total))
        out["cached_free"].append(stats.ratio(sum(c for _, c, _ in b.blocks.values()), total))
        for q, key in ((0.5, "ttft_p50"), (0.95, "ttft_p95")):
            out[key].append(stats.histogram_quantile(b.ttft_buckets, b.ttft_counts, q)
                            if b.ttft_counts else None)
    out["range"] = range_name if range_name in RANGES else "hour"
    out["start"] = start.isoformat()
    out["end"] = now.isoformat()
    return out
