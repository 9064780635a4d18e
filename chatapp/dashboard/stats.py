"""Figures from engine snapshots: pure functions, no database, no Django.

A snapshot is what AsyncEngine.metrics() returns. Hits and queries are in tokens,
as vLLM counts them: queries = prompt tokens looked up, hits = tokens found cached.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

# How an engine runs (kernels.cpu_features path, activation and weight dtypes): shown per
# engine, never added up. None in a snapshot from an engine that predates them.
IDENTITY = ("cpu_path", "dtype", "weight_dtype", "kv_dtype")

# Counters that add up across engines for the "total" row.
SUMMED = (
    "prefix_cache_queries", "prefix_cache_hits", "blocks_total", "blocks_used",
    "blocks_cached_free", "blocks_free", "evictions", "preemptions", "num_running",
    "num_waiting", "prompt_tokens_total", "generation_tokens_total", "requests_finished",
    "requests_failed", "requests_aborted", "prefix_waits", "inflight_shared_blocks",
    # The host/disk KV tier under the pool (0 where an engine has none).
    "prefix_cache_hits_tier", "kv_tier_memory_blocks", "kv_tier_memory_bytes",
    "kv_tier_disk_blocks", "kv_tier_disk_bytes", "kv_tier_offloads", "kv_tier_restores",
)


def ratio(part: float, whole: float) -> float | None:
    """part / whole, or None when there is nothing to divide (no queries is no rate, not 0 %)."""
    return part / whole if whole else None


def quantile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank quantile: always a value that was observed."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def histogram_quantile(
    buckets: Sequence[float], cumulative: Sequence[int], q: float
) -> float | None:
    """Prometheus' histogram_quantile: linear inside the bucket that holds rank q.

    `cumulative` has one more entry than `buckets` (the +Inf bucket); a rank in
    +Inf answers the highest finite bound, as Prometheus does.
    """
    if not cumulative or cumulative[-1] <= 0:
        return None
    rank = q * cumulative[-1]
    lower_bound, lower_count = 0.0, 0
    for bound, count in zip(buckets, cumulative, strict=False):
        if count >= rank:
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return buckets[-1] if buckets else None


def is_hit(request: dict) -> bool:
    """A request that found at least one cached block."""
    return (request.get("cached_tokens") or 0) > 0


def recent_hit_rate(window: Sequence[dict]) -> dict:
    """Token hit rate over these finished requests."""
    prompt = sum(r.get("prompt_tokens") or 0 for r in window)
    cached = sum(r.get("cached_tokens") or 0 for r in window)
    return {"requests": len(window), "prompt_tokens": prompt, "cached_tokens": cached,
            "hit_rate": ratio(cached, prompt)}


def ttft_split(recent: Iterable[dict]) -> dict:
    """TTFT p50 / p95 of recent requests, apart for cache hits and misses: a hit that is
    not faster than a miss means the cache is not paying."""
    groups: dict[str, list[float]] = {"hit": [], "miss": []}
    for r in recent:
        if r.get("ttft") is not None:
            groups["hit" if is_hit(r) else "miss"].append(float(r["ttft"]))
    return {
        name: {"requests": len(v), "p50": quantile(v, 0.5), "p95": quantile(v, 0.95)}
        for name, v in groups.items()
    }


def _last(snapshot: dict, n: int) -> list[dict]:
    return list(snapshot.get("recent_requests") or [])[-n:] if n > 0 else []


def _figures(snapshots: Sequence[dict], window: list[dict], ttft_of: list[dict],
             **identity) -> dict:
    figures = {key: sum(s.get(key, 0) or 0 for s in snapshots) for key in SUMMED}
    reasons: dict[str, int] = {}
    for s in snapshots:
        for reason, n in (s.get("prefix_cache_miss_reasons") or {}).items():
            reasons[reason] = reasons.get(reason, 0) + n
    restore_s = sum((s.get("kv_tier_restore_seconds") or {}).get("sum", 0.0) for s in snapshots)
    figures.update(
        identity,
        miss_reasons=dict(sorted(reasons.items(), key=lambda kv: -kv[1])),
        restore_ms_per_block=ratio(restore_s * 1000, figures["kv_tier_restores"]),
        hit_rate=ratio(figures["prefix_cache_hits"], figures["prefix_cache_queries"]),
        kv_cache_usage=ratio(figures["blocks_used"], figures["blocks_total"]),
        recent=recent_hit_rate(window),
        ttft=ttft_split(ttft_of),
    )
    return figures


def engine_figures(snapshot: dict, recent_n: int) -> dict:
    """The dashboard's figures for one engine snapshot (TTFT over all its recent requests)."""
    return _figures([snapshot], _last(snapshot, recent_n), snapshot.get("recent_requests") or [],
                    engine_id=snapshot.get("engine_id", ""), model=snapshot.get("model", ""),
                    block_size=snapshot.get("block_size"),
                    **{key: snapshot.get(key) for key in IDENTITY})


def total_figures(snapshots: Sequence[dict], recent_n: int) -> dict:
    """Figures summed over engines; rates are recomputed from the summed tokens."""
    # Each engine's own last n: there is no common clock to merge them by.
    recent = [r for s in snapshots for r in _last(s, recent_n)]
    # TTFT over every recent request of each engine, as engine_figures takes it: with one
    # engine the two must agree (they did not when this took only the last n).
    every = [r for s in snapshots for r in s.get("recent_requests") or []]
    return _figures(snapshots, recent, every, engine_id="total", model="", block_size=None,
                    **dict.fromkeys(IDENTITY))


def model_figures(snapshots: Sequence[dict], recent_n: int) -> list[dict]:
    """total_figures() per model (a snapshot's `model`: the alias it serves), in order of
    first appearance; their summed counters add up to the total over all snapshots."""
    by_model: dict[str, list[dict]] = {}
    for s in snapshots:
        by_model.setdefault(str(s.get("model") or ""), []).append(s)
    out = []
    for model, group in by_model.items():
        figures = total_figures(group, recent_n)
        figures.update(model=model, engine_id=f"model {model}", engines=len(group))
        out.append(figures)
    return out
