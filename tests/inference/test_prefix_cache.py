"""Prefix hits: shared prefixes, continued conversations, tenant isolation."""

import random

from inference import SamplingParams
from inference.block_pool import BlockPool

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


def rand_ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 49000) for _ in range(n)]


def test_shared_512_token_prefix_hits_its_full_blocks(make_engine):
    engine = make_engine()
    prefix = rand_ids(512, 0)
    [[a]] = engine.generate([prefix + rand_ids(20, 1)], GREEDY)
    assert a.cached_tokens == 0
    [[b]] = engine.generate([prefix + rand_ids(30, 2)], GREEDY)
    assert b.cached_tokens == 512 >= 496
    # A prompt equal to the cached prefix still computes its last block for logits.
    [[c]] = engine.generate([prefix], GREEDY)
    assert c.cached_tokens == 496
    snap = engine.metrics_snapshot()
    assert snap["prefix_cache_hits"] == 512 + 496
    assert snap["prefix_cache_queries"] == 532 + 542 + 512


def test_next_turn_reuses_previous_prompt_and_reply_blocks(make_engine):
    engine = make_engine()
    turn1 = rand_ids(100, 3)
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    [[r1]] = engine.generate([turn1], params)
    assert len(r1.token_ids) == 40
    turn2 = turn1 + r1.token_ids + rand_ids(10, 4)
    [[r2]] = engine.generate([turn2], params)
    # 140 tokens were known; the last generated token was never fed back, so 139 had KV
    # written; every full block among them (8 x 16 = 128) is reused, including the two
    # blocks (96..127) filled while decoding.
    assert r2.cached_tokens == 128
    assert r2.cached_tokens > len(turn1)


def test_different_cache_salt_never_shares(make_engine):
    engine = make_engine()
    prompt = rand_ids(200, 5)
    [[a]] = engine.generate([prompt], GREEDY, cache_salt="tenant-a")
    [[b]] = engine.generate([prompt], GREEDY, cache_salt="tenant-b")
    [[c]] = engine.generate([prompt], GREEDY, cache_salt="tenant-a")
    [[d]] = engine.generate([prompt], GREEDY)  # no salt is its own tenant too
    assert a.cached_tokens == 0
    assert b.cached_tokens == 0
    assert c.cached_tokens == 192
    assert d.cached_tokens == 0


def test_prefix_caching_off_reports_no_hits(make_engine):
    engine = make_engine(enable_prefix_caching=False)
    prompt = rand_ids(100, 6)
    engine.generate([prompt], GREEDY)
    [[b]] = engine.generate([prompt], GREEDY)
    assert b.cached_tokens == 0
    assert engine.metrics_snapshot()["blocks_cached_free"] == 0


def test_parallel_samples_share_prompt_blocks(make_engine):
    engine = make_engine()
    prompt = rand_ids(100, 7)
    engine.add_request("r", prompt, SamplingParams(n=3, max_tokens=4, temperature=1.0, seed=1))
    seen_shared = False
    while engine.has_unfinished_requests():
        engine.step()
        seqs = [s for s in engine.requests.get("r", []) if s.block_table]
        if len(seqs) == 3:
            shared = set(seqs[0].block_table[:6])
            seen_shared |= all(set(s.block_table[:6]) == shared for s in seqs)
    assert seen_shared


def test_eviction_takes_least_recently_used_and_chain_tail_first(make_engine):
    engine = make_engine(num_blocks=20)
    a, b = rand_ids(64, 8), rand_ids(64, 9)  # 4 full blocks each
    engine.generate([a], SamplingParams(max_tokens=1, temperature=0))
    engine.generate([b], SamplingParams(max_tokens=1, temperature=0))
    # A 13-block request takes the 12 never-used blocks, then must evict one cached
    # block: a's (least recently used) tail, not its head and nothing of b.
    engine.generate([rand_ids(12 * 16 + 8, 10)], SamplingParams(max_tokens=1, temperature=0))
    assert engine.metrics_snapshot()["evictions"] == 1
    [[rb]] = engine.generate([b + [5]], SamplingParams(max_tokens=1, temperature=0))
    [[ra]] = engine.generate([a + [5]], SamplingParams(max_tokens=1, temperature=0))
    assert rb.cached_tokens == 64
    # b's extra block reused the long request's partial tail block (no hash, nothing
    # to hit) instead of evicting the next of a's chain: a keeps its first 3 blocks.
    assert ra.cached_tokens == 48


def test_a_freed_block_without_a_hash_is_reused_before_a_cached_one_is_evicted():
    pool = BlockPool(4)
    cached, partial = pool.allocate(2)
    pool.cache_block(cached, b"h", [1] * 16)
    pool.free([partial, cached])  # a sequence frees its blocks tail first
    # Two never-used blocks are at the front; the partial block goes before them too.
    assert [b.block_id for b in pool.allocate(3)] == [partial.block_id, 2, 3]
    assert pool.lookup(b"h") is cached and pool.num_evictions == 0


def test_same_block_computed_twice_stays_findable_after_one_copy_is_evicted():
    """Two sequences that fill the same block at once hold two copies under one
    hash; evicting the free copy must leave the live one findable."""
    from inference.block_pool import BlockPool, hash_block

    pool = BlockPool(4)
    a, b = pool.allocate(2)
    h = hash_block(None, [1, 2, 3, 4])
    pool.cache_block(a, h, [1, 2, 3, 4])
    pool.cache_block(b, h, [1, 2, 3, 4])
    pool.free([a])
    pool.allocate(pool.num_free_blocks)  # pressure evicts the free copy
    assert a.block_hash is None
    assert pool.lookup(h) is b
