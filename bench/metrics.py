"""Serving metrics as vLLM's `bench serve` reports them, from per-request timestamps.

A RequestRecord holds what a client sees of one request: when it was sent, when
each piece of output arrived, when it ended, and the usage the server reported.
Everything else (TTFT, TPOT, inter-token latency, end-to-end latency, throughput,
the cached share of prompt tokens and its theoretical maximum) is computed here,
the same way for the HTTP client and the in-process runs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np


@dataclass
class RequestRecord:
    conversation: int
    turn: int  # 1-based
    start: float  # perf_counter seconds
    end: float | None = None
    first_token: float | None = None  # arrival of the first non-empty output
    chunk_times: list[float] = field(default_factory=list)  # every non-empty output, first included
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    # The most prompt tokens an ideal prefix cache could have served (None: unknown).
    max_cached_tokens: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.end is not None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start

    @property
    def e2e(self) -> float | None:
        return None if self.end is None else self.end - self.start

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (e2e - ttft) / (tokens - 1)."""
        if self.ttft is None or self.e2e is None or self.completion_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.completion_tokens - 1)

    @property
    def itl(self) -> list[float]:
        """Gaps between consecutive outputs (a streamed chunk may carry several tokens)."""
        t = self.chunk_times
        return [b - a for a, b in zip(t, t[1:], strict=False)]

    def as_dict(self) -> dict:
        d = asdict(self)
        del d["chunk_times"]
        d.update(
            ok=self.ok, ttft=self.ttft, tpot=self.tpot, e2e=self.e2e, chunks=len(self.chunk_times)
        )
        return d


# --- statistics ----------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), interpolating linearly between ranks (as vLLM reports)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError("q must lie in [0, 100]")
    return float(np.percentile(values, q))


def stats(values: Iterable[float | None]) -> dict:
    """count, mean, p50, p90, p99 of the values that are not None (None fields when empty)."""
    v = [x for x in values if x is not None]
    if not v:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None}
    return {
        "count": len(v),
        "mean": sum(v) / len(v),
        "p50": percentile(v, 50),
        "p90": percentile(v, 90),
        "p99": percentile(v, 99),
    }


# --- prefix-cache ceilings -----------------------------------------------------
def whole_blocks(tokens: int, block_size: int) -> int:
    return max(0, tokens) // block_size * block_size


def cacheable_tokens(
    prompt_tokens: int, new_tokens: int, history_tokens: int | None, block_size: int
) -> int:
    """Prompt tokens an ideal prefix cache serves: everything but the new message
    (new_tokens), no more than the earlier requests computed (history_tokens, None for
    no bound), never the last prompt token (its logits are needed), whole blocks only."""
    n = min(prompt_tokens - new_tokens, prompt_tokens - 1)
    if history_tokens is not None:
        n = min(n, history_tokens)
    return whole_blocks(n, block_size)


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def cacheable_from(prompt: Sequence[int], earlier: Iterable[Sequence[int]], block_size: int) -> int:
    """Exact ceiling when token ids are known: the longest prefix the prompt shares
    with any token sequence computed before it, less the last token, in whole blocks."""
    shared = max((common_prefix_len(prompt, e) for e in earlier), default=0)
    return whole_blocks(min(shared, len(prompt) - 1), block_size)


# --- summaries -----------------------------------------------------------------
def cache_figures(records: Sequence[RequestRecord]) -> dict:
    prompt = sum(r.prompt_tokens for r in records)
    cached = sum(r.cached_tokens for r in records)
    out = {
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cached_share": cached / prompt if prompt else 0.0,
        "max_cached_tokens": None,
        "max_cached_share": None,
        "cached_share_of_max": None,
    }
    if records and all(r.max_cached_tokens is not None for r in records):
        most = sum(r.max_cached_tokens for r in records)
        out["max_cached_tokens"] = most
        out["max_cached_share"] = most / prompt if prompt else 0.0
        out["cached_share_of_max"] = cached / most if most else None
    return out


def summarize(records: Sequence[RequestRecord], duration: float) -> dict:
    """The figures of one run: throughput over `duration` seconds, latency statistics
    of the requests that succeeded, and the cached share of their prompt tokens."""
    ok = [r for r in records if r.ok]
    out_tokens = sum(r.completion_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    return {
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "errors": sorted({r.error for r in records if r.error})[:5],
        "duration_s": duration,
        "completion_tokens": out_tokens,
        "request_throughput": len(ok) / duration if duration > 0 else None,
        "output_throughput": out_tokens / duration if duration > 0 else None,
        "total_token_throughput": (in_tokens + out_tokens) / duration if duration > 0 else None,
        **cache_figures(ok),
        "ttft_s": stats(r.ttft for r in ok),
        "tpot_s": stats(r.tpot for r in ok),
        "itl_s": stats(x for r in ok for x in r.itl),
        "e2e_s": stats(r.e2e for r in ok),
    }


def by_turn(records: Sequence[RequestRecord]) -> list[dict]:
    """TTFT statistics and cached share for each turn index."""
    ok = [r for r in records if r.ok]
    out = []
    for turn in sorted({r.turn for r in ok}):
        rs = [r for r in ok if r.turn == turn]
        out.append(
            {
                "turn": turn,
                "requests": len(rs),
                "prompt_tokens_mean": sum(r.prompt_tokens for r in rs) / len(rs),
                "ttft_s": stats(r.ttft for r in rs),
                **cache_figures(rs),
            }
        )
    return out


def later_turns(records: Sequence[RequestRecord], first: int = 2) -> list[RequestRecord]:
    return [r for r in records if r.turn >= first]


def median_call_seconds(fn: Callable[[], object], iters: int) -> float:
    """Median seconds of one call of fn over iters calls, after three warm-up calls."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)

