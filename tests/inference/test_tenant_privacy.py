"""A tenant learns nothing about another tenant's cache: not from its receipt,
not from how much work its prompt costs. Tenants are cache salts; the engine tells a
request only about its own salt's history, and counts cross-tenant misses in aggregate."""

from __future__ import annotations

import dataclasses
import json
import random

from inference import SamplingParams

ONE = SamplingParams(max_tokens=1, temperature=0)
BS = 16


def rand_ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 49000) for _ in range(n)]


def counting(engine) -> list[list[int]]:
    """Record the tokens each model step computes, per step (the work a prompt costs)."""
    steps: list[list[int]] = []
    execute = engine.runner.execute

    def wrapped(seqs, num_tokens, scoring=None):
        steps.append(list(num_tokens))
        return execute(seqs, num_tokens, scoring)

    engine.runner.execute = wrapped
    return steps


def run(engine, prompt, salt):
    [[out]] = engine.generate([prompt], ONE, cache_salt=salt)
    return out


def evict_everything(engine, seed: int = 99) -> None:
    run(engine, rand_ids(engine.kv.pool.num_blocks * BS - 8, seed), "filler")


def public(out) -> dict:
    """Everything about a request that can reach its client (the worker->web stream
    carries dataclasses.asdict of the output), less its own ids and text."""
    data = dataclasses.asdict(out)
    for key in ("request_id", "text_delta", "new_token_ids", "token_ids", "text", "ttft",
                "metrics"):
        data.pop(key)
    return data


def test_another_tenant_s_prompt_reads_and_costs_as_one_never_sent(make_engine):
    engine = make_engine(num_blocks=64, max_num_batched_tokens=64)
    p, q = rand_ids(150, 1), rand_ids(150, 2)  # the same length, never sharing a block
    run(engine, p, "tenant-a")
    steps = counting(engine)

    b_p = run(engine, p, "tenant-b")
    work_p, steps[:] = list(steps), []
    b_q = run(engine, q, "tenant-b")
    work_q = list(steps)

    # The same receipt and the same whole output shape: cold, nothing matched.
    assert b_p.cached_tokens == b_q.cached_tokens == 0
    assert b_p.prefix_cache == b_q.prefix_cache
    assert (b_p.prefix_cache.reason, b_p.prefix_cache.matched_tokens) == ("cold", 0)
    assert public(b_p) == public(b_q)
    assert "salt" not in json.dumps(dataclasses.asdict(b_p))
    # The same work: every prompt token computed, in the same chunks.
    assert work_p == work_q and sum(sum(s) for s in work_p) == len(p)

    # The control: tenant A's own copy hits (the measure above can see a hit).
    steps[:] = []
    a_p = run(engine, p, "tenant-a")
    assert a_p.cached_tokens == 144 and sum(sum(s) for s in steps) == len(p) - 144

    # Only the aggregate says one miss was on another tenant's tokens.
    snap = engine.metrics_snapshot()
    assert snap["prefix_cache_miss_reasons"]["salt"] == 1
    rows = snap["recent_requests"]  # per request, as the dashboard lists them
    assert {r["prefix_cache"]["reason"] for r in rows} == {"cold", "full"}
    assert not any(k for r in rows for k in r if "reason" in k and k != "finish_reason")


def test_evicted_speaks_only_of_the_tenant_s_own_blocks(make_engine):
    for kw in ({}, {"kv_offload_bytes": 1 << 20}):  # the pool alone, and with the tier
        engine = make_engine(num_blocks=12, **kw)
        p = rand_ids(64, 3)
        run(engine, p + [5], "tenant-a")
        evict_everything(engine)
        restores = engine.metrics_snapshot().get("kv_tier_restores", 0)
        b = run(engine, p + [5], "tenant-b").prefix_cache
        # Never-sent tokens for B read the same, whether A's copy is evicted or not.
        assert (b.reason, b.evicted_from, b.matched_tokens, b.tier_tokens) == ("cold", None, 0, 0)
        assert engine.metrics_snapshot().get("kv_tier_restores", 0) == restores
        evict_everything(engine, seed=98)
        a = run(engine, p + [5], "tenant-a").prefix_cache
        if kw:
            assert (a.reason, a.matched_tokens) == ("full", 64)  # its own, from the tier
        else:
            assert (a.reason, a.evicted_from) == ("evicted", "pool")
