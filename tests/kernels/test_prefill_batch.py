"""Short prefill chunks of several sequences attend in one batched call: the same
attention as one call per sequence and as dense causal attention, over ragged
chunk and context lengths, with and without cached prefixes, with grouped-query
heads, on both CPU paths (scores held whole, flash)."""

import pytest
import torch

import kernels.attention as attention
from kernels.attention import (
    AttentionMetadata,
    group_short_prefills,
    paged_attention,
)
from tests.kernels.test_attention import build_step, dense_attention

# (context length, query tokens).
PROMPTS = [(16, 16)] * 5 + [(3, 3), (11, 11), (17, 17), (2, 2)]  # whole prompts, ragged
OVER_PREFIX = [(40, 7), (21, 5), (64, 16), (33, 2), (50, 30), (18, 9)]  # chunks over a cache
EQUAL = [(16, 16)] * 6 + [(5, 1)]  # in place, unpadded (then a decode)
MIXED = OVER_PREFIX + PROMPTS + [(29, 1), (7, 1)] + [(300, 40), (900, 20)]  # decodes, long


def spy(monkeypatch, name):
    calls = []
    real = getattr(attention, name)
    monkeypatch.setattr(attention, name, lambda *a: calls.append(a) or real(*a))
    return calls


@pytest.mark.parametrize(
    "shapes", [PROMPTS, OVER_PREFIX, MIXED, EQUAL], ids=["prompts", "prefix", "mixed", "equal"]
)
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (9, 3)])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("scores", ["held-whole", "flash"])
@pytest.mark.parametrize("head_dim", [8, 64])
def test_batched_matches_per_sequence_and_dense(
    shapes, num_heads, num_kv_heads, dtype, tol, scores, head_dim, monkeypatch
):
    held = {torch.float32, torch.bfloat16} if scores == "held-whole" else set()
    monkeypatch.setattr(attention, "_HELD_WHOLE_DTYPES", held)
    if scores == "flash":  # the batched call holds its scores whole on CPU up to this
        monkeypatch.setattr(attention, "_MAX_SCORES", 0)
    q, k_cache, v_cache, meta, (queries, ks, vs) = build_step(
        shapes, num_heads, num_kv_heads, head_dim, dtype
    )
    scale = head_dim**-0.5
    calls = spy(monkeypatch, "_prefill_batch_attention")
    batched = paged_attention(q, k_cache, v_cache, meta, scale)
    assert calls, "the short chunks should share a call"
    taken = len(calls)
    monkeypatch.setattr(attention, "_BATCH_MAX_QUERY", 0)  # one call per sequence
    fresh = AttentionMetadata(meta.slot_mapping, meta.block_tables, meta.query_start_loc,
                              meta.seq_lens)
    per_seq = paged_attention(q, k_cache, v_cache, fresh, scale)
    assert len(calls) == taken
    qsl = meta.query_start_loc
    for i, (length, n) in enumerate(shapes):
        ref = dense_attention(queries[i].float(), ks[i].float(), vs[i].float(), scale)
        got = batched[qsl[i] : qsl[i + 1]].float()
        assert (got - ref).abs().max().item() < tol, (length, n)
        assert (got - per_seq[qsl[i] : qsl[i + 1]].float()).abs().max().item() < tol, (length, n)


def test_thirty_two_short_prompts_take_one_call_per_layer(monkeypatch):
    q, k_cache, v_cache, meta, _ = build_step([(16, 16)] * 32, 9, 3, 64, torch.float32)
    batched = spy(monkeypatch, "_prefill_batch_attention")
    single = spy(monkeypatch, "_attend_over_prefix")
    held = spy(monkeypatch, "_attend_held_whole")
    for _ in range(3):  # layers share the step's metadata
        paged_attention(q, k_cache, v_cache, meta, 0.125)
    assert len(batched) == 3 and not single and not held
    [p] = meta.prefill_batches(k_cache.shape[1])
    assert p.span == (0, 32 * 16) and p.real_rows is None  # views, no gather


def test_long_chunks_keep_their_own_path(monkeypatch):
    shapes = [(600, 40), (700, 80), (2000, 16), (16, 16)]
    q, k_cache, v_cache, meta, _ = build_step(shapes, 4, 2, 8, torch.float32)
    assert meta.prefill_batches(4) == []
    calls = spy(monkeypatch, "_prefill_batch_attention")
    paged_attention(q, k_cache, v_cache, meta, 0.3)
    assert calls == []


def test_groups_are_cut_where_padding_would_double_the_work():
    # Equal prompts: one group. Decodes and long chunks: never batched.
    assert group_short_prefills([16] * 4, [16] * 4) == [[0, 1, 2, 3]]
    assert group_short_prefills([1, 1, 16], [9, 9, 16]) == []
    assert group_short_prefills([16, 40], [16, 40]) == []
    # A short prompt and a short chunk over a long history go to different groups.
    groups = group_short_prefills([16, 16, 8, 8], [16, 16, 120, 110])
    assert sorted(map(sorted, groups)) == [[0, 1], [2, 3]]
    # Alone in its group: per-sequence.
    assert group_short_prefills([16, 16, 8], [16, 16, 120]) == [[0, 1]]
    # Too many scores per chunk (n x L) or keys: per-sequence.
    assert group_short_prefills([32, 32], [100, 100]) == []
    assert group_short_prefills([4, 4], [200, 200]) == []
