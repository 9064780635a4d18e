"""What the engine hands back for a request, step by step."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PrefixCacheRecord:
    """Where a prompt's prefix-cache match ended, and why (see inference/miss_reason.py)."""

    matched_tokens: int  # prompt tokens served from cache (pool and host/disk tier)
    tier_tokens: int  # of those, copied back from the host/disk tier
    # "full" | "evicted" | "cold" | "disabled": from the request's own tenant's history
    # only. Keep anything about other tenants out of this record: it reaches clients
    # (as_dict, RequestOutput, and dataclasses.asdict on the worker->web stream).
    reason: str
    evicted_from: str | None = None  # when evicted: "pool" (not in the tier) or "tier"

    def as_dict(self) -> dict:
        return {"matched_tokens": self.matched_tokens, "tier_tokens": self.tier_tokens,
                "reason": self.reason, "evicted_from": self.evicted_from}


@dataclass
class RequestOutput:
    """One sample's progress after a step (one per sample when n > 1)."""

    request_id: str
    index: int  # which of the n samples
    text_delta: str  # new text since the last output of this sample
    new_token_ids: list[int]
    token_ids: list[int]  # every token generated so far
    text: str  # the whole text so far
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | "error"
    prompt_tokens: int
    cached_tokens: int  # prompt tokens served from the prefix cache
    ttft: float | None  # seconds from arrival to the first token
    error: str | None = None
    # The prefix-cache receipt of the request's first admission (None before it).
    prefix_cache: PrefixCacheRecord | None = None
    metrics: dict = field(default_factory=dict)
    # One sampler.TokenLogprob per new_token_ids entry when the request asked for them.
    new_logprobs: list | None = None
    # With SamplingParams.prompt_logprobs, on the first output of sample 0 only: one
    # entry per prompt token, None for the first, sampler.TokenLogprob for the others.
    prompt_logprobs: list | None = None
