"""Window-aware KV (inference/kv_groups.py): a sliding-window layer keeps KV only for
its window, in KV groups sharing one pool, with the prefix cache intact."""

from __future__ import annotations

import logging

import pytest
import torch

from inference import SamplingParams
from inference.kv_cache_manager import KVCacheManager
from inference.kv_groups import RELEASED, held_pages, kv_groups, whole
from inference.kv_offload import KVTier
from inference.sequence import Sequence
from tests.inference.test_gemma3 import (
    WINDOW,
    gemma3_hf,  # noqa: F401
    gemma_engine,
    prompt,
    tiny_gemma3,  # noqa: F401
)

# Gemma 3 270M's shape (its config): 18 layers, one full in six, window 512, one KV head
# of 256, bf16 KV.
GEMMA3_270M_WINDOWS = [None if (i + 1) % 6 == 0 else 512 for i in range(18)]
GEMMA3_270M_LAYER_BYTES = 2 * 1 * 256 * 2  # K and V, per layer and token


def test_layers_fall_into_groups_of_one_kind_and_equal_size():
    groups = kv_groups(GEMMA3_270M_WINDOWS)
    assert groups.group_size == 3 and groups.num_groups == 6
    assert groups.windows == (None, 512, 512, 512, 512, 512)
    assert groups.layers[0] == (5, 11, 17)  # the full group first: block_table is whole
    assert sorted(i for g in groups.layers for i in g) == list(range(18))
    assert groups.pages_per_whole_block() == 6
    tiny = kv_groups([WINDOW, WINDOW, None, WINDOW])
    assert tiny.group_size == 1 and tiny.layers == ((2,), (0,), (1,), (3,))
    assert tiny.place(3) == (3, 0) and tiny.place(2) == (0, 0)
    # Full attention everywhere, or the option off: one group of every layer, as before.
    assert kv_groups([None] * 4) == whole(4) and not whole(4).hybrid
    assert kv_groups(GEMMA3_270M_WINDOWS, enabled=False) == whole(18)
    # A kind whose count is not a multiple of the group size ends in a short group.
    odd = kv_groups([None, None, 8, 8, 8])
    assert odd.group_size == 2 and odd.layers == ((0, 1), (2, 3), (4,))


def test_gemma3_270m_holds_far_fewer_kv_bytes_per_token_on_a_long_context():
    """The figure for docs/engine.md: KV bytes a sequence holds per token of an 8k
    context, window-aware against whole."""
    hybrid, flat = kv_groups(GEMMA3_270M_WINDOWS), whole(18)
    bs, context = 16, 8192

    def per_token(groups) -> float:
        page = groups.group_size * bs * GEMMA3_270M_LAYER_BYTES
        return held_pages(groups, context, bs) * page / context

    assert per_token(flat) == 18 * GEMMA3_270M_LAYER_BYTES  # 18 KiB
    # 3 full layers whole, 15 sliding ones a window each (512 tokens, 32 blocks, at a
    # block-aligned context; a block more at most elsewhere).
    assert per_token(hybrid) == (3 * context + 15 * 512) * GEMMA3_270M_LAYER_BYTES / context
    assert per_token(hybrid) < 0.3 * per_token(flat)


def manager(num_pages: int, windows, block_size: int = 4) -> KVCacheManager:
    return KVCacheManager(num_pages, block_size, groups=kv_groups(windows))


def run_prefill(kv: KVCacheManager, seq: Sequence, chunk: int) -> None:
    """Schedule seq's prompt chunk by chunk as the engine does (no model)."""
    seq.block_hashes.clear()
    hits = kv.find_cached_blocks(seq)
    n = min(chunk, seq.num_tokens - len(hits) * kv.block_size)
    assert kv.can_admit(hits, n)
    kv.admit(seq, hits, n)
    while True:
        seq.num_computed_tokens += n
        kv.cache_computed_blocks(seq)
        n = min(chunk, seq.num_tokens - seq.num_computed_tokens)
        if n <= 0:
            return
        assert kv.can_grow(seq, n)
        kv.grow(seq, n)


def test_a_sliding_group_releases_what_left_its_window_and_keeps_it_cached():
    kv = manager(64, [None, 6, 6])  # block 4: a query reads its own and the previous block
    seq = Sequence("a", 0, list(range(100, 141)), SamplingParams())
    run_prefill(kv, seq, chunk=4)
    # After the prompt: the full group holds all 11 blocks, each sliding group the three
    # its last query (position 40, window 35..40) read; the rest went back to the pool.
    assert len(seq.block_table) == 11 and RELEASED not in seq.block_table
    for table in seq.group_tables:
        assert table[:8] == [RELEASED] * 8 and RELEASED not in table[8:]
    assert kv.pool.num_used_blocks == 11 + 2 * 3 == held_pages(kv.groups, 41, 4)
    # The next step (the query at 41 reads 36..41) gives back one more page per group.
    assert kv.can_grow(seq, 1)
    kv.grow(seq, 1)
    assert [t[8] for t in seq.group_tables] == [RELEASED] * 2
    assert kv.pool.num_used_blocks == 11 + 2 * 2
    kv.free(seq)
    assert kv.pool.num_used_blocks == 0

    # The same prompt again hits 10 blocks (its last token is computed), every group's.
    again = Sequence("b", 0, list(range(100, 141)), SamplingParams())
    hits = kv.find_cached_blocks(again)
    assert len(hits) == 10
    assert [b is None for b in hits.tables[1]] == [True] * 8 + [False] * 2


def evict(kv: KVCacheManager, group: int, seq: Sequence, block: int) -> None:
    page = kv.pool.lookup(kv._key(group, seq.block_hashes[block]))
    kv.pool._evict(page)


def test_a_hit_needs_the_full_prefix_and_only_the_sliding_window_before_it():
    kv = manager(64, [None, 6, 6])
    ids = list(range(200, 241))
    first = Sequence("a", 0, ids, SamplingParams())
    run_prefill(kv, first, chunk=8)
    kv.free(first)

    def hit() -> int:
        seq = Sequence("q", 0, ids, SamplingParams())
        return len(kv.find_cached_blocks(seq))

    assert hit() == 10
    # A sliding page before the window of position 40 is not needed.
    evict(kv, 1, first, 5)
    assert hit() == 10
    # One inside it is: the hit ends where the window is whole again.
    evict(kv, 2, first, 9)
    assert hit() == 9
    # A full group's page is needed from the start.
    evict(kv, 0, first, 3)
    assert hit() == 3


def test_a_hybrid_pool_refuses_the_host_tier(tmp_path):
    kv = manager(16, [None, 6])
    tier = KVTier(torch.zeros(2, 1, 16, 4, 1, 8), 1 << 20, None, 0, "m")
    with pytest.raises(ValueError, match="sliding-window KV groups"):
        kv.attach_tier(tier)


@pytest.fixture
def engines(tiny_gemma3, tmp_path):  # noqa: F811
    """Window-aware and whole-KV engines of the same budget (64 blocks of every layer)."""
    return (gemma_engine(tiny_gemma3, tmp_path, num_blocks=64),
            gemma_engine(tiny_gemma3, tmp_path, num_blocks=64, sliding_window_kv=False))


def test_a_long_sequence_holds_measurably_fewer_kv_bytes(engines):
    hybrid, flat = engines
    assert hybrid.runner.kv_cache.nbytes == flat.runner.kv_cache.nbytes
    assert hybrid.metrics_snapshot()["blocks_total"] == 4 * 64  # pages of one layer
    held = {}
    for name, engine in (("hybrid", hybrid), ("whole", flat)):
        engine.add_request(name, prompt(600, seed=9),
                           SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
        used = []
        while engine.has_unfinished_requests():
            engine.step()
            used.append(engine.kv.pool.num_used_blocks)
        page = engine.runner.kv_cache[0, :, 0].nbytes * 2  # K and V of one page
        # Held at its last decode step (after it the sequence is freed).
        held[name] = used[-2] * page
    # 607 tokens: whole KV holds 4 layers x 38 blocks; window-aware, the full layer's 38
    # and each sliding layer the 2 blocks its window of 24 reaches.
    layer_block = hybrid.runner.kv_cache[0, 0, 0].nbytes * 2
    assert held["whole"] == 4 * 38 * layer_block
    assert held["hybrid"] == (38 + 3 * 2) * layer_block


def test_a_second_request_sharing_a_long_prefix_hits_it(engines):
    hybrid, flat = engines
    system = prompt(200, seed=11)
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    outs = {}
    for name, engine in (("hybrid", hybrid), ("whole", flat)):
        [[a]] = engine.generate([system + prompt(30, seed=12)], params)
        [[b]] = engine.generate([system + prompt(41, seed=13)], params)
        # The shared prefix, to its last full block; the next block mixes in new tokens.
        assert a.cached_tokens == 0 and b.cached_tokens == 192, name
        assert (b.prefix_cache.matched_tokens, b.prefix_cache.reason) == (192, "cold")
        outs[name] = (a.token_ids, b.token_ids)
    assert outs["hybrid"] == outs["whole"]
    snapshot = hybrid.metrics_snapshot()
    assert snapshot["blocks_used"] == 0 and snapshot["blocks_cached_free"] > 0


def test_a_gemma3_engine_declines_the_host_tier_with_a_message(tiny_gemma3, tmp_path,  # noqa: F811
                                                               caplog):
    with caplog.at_level(logging.WARNING, logger="inference.llm_engine"):
        engine = gemma_engine(tiny_gemma3, tmp_path, kv_offload_bytes=1 << 20)
    assert engine.kv_tier is None and engine.kv.tier is None
    assert "host/disk KV tier" in caplog.text
    whole_kv = gemma_engine(tiny_gemma3, tmp_path, kv_offload_bytes=1 << 20,
                            sliding_window_kv=False)
    assert whole_kv.kv_tier is not None


def test_the_fp32_c_decode_step_reads_each_groups_tables(tiny_gemma3, gemma3_hf, tmp_path):  # noqa: F811
    """Decode steps of several sequences past the window run as one C call over the KV
    groups, and the greedy tokens are transformers'."""
    from kernels.decode_stack import runs_here

    if not runs_here(torch.float32):
        pytest.skip("no fp32 C decode step on this CPU")
    engine = gemma_engine(tiny_gemma3, tmp_path, num_blocks=64)
    model = engine.runner.model
    assert engine.runner.kv_groups.hybrid and model.decode_stack is not None
    calls = []
    step = model.decode_stack

    class Counting:
        def __getattr__(self, name):
            return getattr(step, name)

        def __call__(self, *args):
            calls.append(args[3].shape)  # slots: [groups, rows]
            return step(*args)

    model.decode_stack = Counting()
    prompts = [prompt(40 + 11 * i, seed=30 + i) for i in range(3)]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    outs = [o[0].token_ids for o in engine.generate(prompts, params)]
    assert calls and all(shape[0] == 4 for shape in calls)
    assert any(shape[1] == 3 for shape in calls)
    for ids, ours in zip(prompts, outs, strict=True):
        with torch.no_grad():
            g = gemma3_hf.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)
        assert g[0, len(ids):].tolist() == ours


def test_sibling_samples_share_the_prompt_under_either_layout(engines):
    """n > 1: the later samples hit the first one's prompt (the sliding groups' window
    pages included) and sample what they do over whole KV."""
    params = SamplingParams(n=3, max_tokens=12, temperature=0.8, seed=5, ignore_eos=True)
    got = []
    for engine in engines:
        [outs] = engine.generate([prompt(90, seed=3)], params)
        assert [o.cached_tokens for o in outs] == [0, 80, 80]
        got.append([o.token_ids for o in outs])
        assert engine.metrics_snapshot()["blocks_used"] == 0
    assert got[0] == got[1]
