"""The torch reference ops against plain dense causal attention."""

import pytest
import torch

from kernels.attention import (
    AttentionMetadata,
    _attend_held_whole,
    _attend_over_prefix,
    _attend_prefix_then_self,
    paged_attention,
    store_kvcache,
)


def dense_attention(q, k, v, scale):
    """q [n, H, D] at the last n positions of k/v [L, Hkv, D]; causal."""
    n, L = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,lhd->hnl", q, k) * scale
    q_pos = torch.arange(L - n, L)[:, None]
    scores = scores.masked_fill(torch.arange(L)[None, :] > q_pos, float("-inf"))
    return torch.einsum("hnl,lhd->nhd", scores.softmax(-1), v)


# (context length, query tokens): whole prompts, chunks over a cached prefix (short
# and long), several decodes, ragged lengths.
MIXED = [(9, 9), (13, 5), (7, 1), (17, 1), (1, 1), (30, 3), (45, 12), (40, 40), (530, 7)]
# A lone decode, and a step of ragged decodes only (the decode-only fast path).
LONE_DECODE = [(140, 1)]
DECODES = [(7, 1), (17, 1), (33, 1), (5, 1), (33, 1)]


def build_step(shapes, num_heads, num_kv_heads, head_dim, dtype, bs=4, num_blocks=1024):
    """A paged cache holding each sequence's cached part and a step's metadata for
    its new tokens, stored as the model would; returns what paged_attention takes
    plus the dense K/V and queries for the reference."""
    torch.manual_seed(len(shapes) + head_dim)
    k_cache = torch.zeros(num_blocks, bs, num_kv_heads, head_dim, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    perm = torch.randperm(num_blocks).tolist()
    tables, ks, vs, queries, slots, qsl, lens = [], [], [], [], [], [0], []
    for length, n in shapes:
        table = [perm.pop() for _ in range(-(-length // bs))]
        k = torch.randn(length, num_kv_heads, head_dim, dtype=dtype)
        v = torch.randn(length, num_kv_heads, head_dim, dtype=dtype)
        for pos in range(length - n):
            k_cache[table[pos // bs], pos % bs] = k[pos]
            v_cache[table[pos // bs], pos % bs] = v[pos]
        tables.append(table)
        ks.append(k)
        vs.append(v)
        queries.append(torch.randn(n, num_heads, head_dim, dtype=dtype))
        slots += [table[p // bs] * bs + p % bs for p in range(length - n, length)]
        qsl.append(qsl[-1] + n)
        lens.append(length)
    width = max(map(len, tables))
    bt = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    meta = AttentionMetadata(torch.tensor(slots), bt, qsl, lens)
    new_k = torch.cat([k[L - n :] for k, (L, n) in zip(ks, shapes, strict=True)])
    new_v = torch.cat([v[L - n :] for v, (L, n) in zip(vs, shapes, strict=True)])
    store_kvcache(new_k, new_v, k_cache, v_cache, meta.slot_mapping)
    return torch.cat(queries), k_cache, v_cache, meta, (queries, ks, vs)


@pytest.mark.parametrize(
    "shapes", [MIXED, LONE_DECODE, DECODES], ids=["mixed", "lone-decode", "decodes"]
)
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (6, 2)])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("scores", ["held-whole", "flash"])
@pytest.mark.parametrize("head_dim", [8, 64])
def test_paged_attention_matches_dense(
    shapes, num_heads, num_kv_heads, dtype, tol, scores, head_dim, monkeypatch
):
    """Either way a prompt or chunk attends on CPU (its scores held whole, or torch's
    flash kernel with AMX, in fp32 or past the size limit) gives causal attention;
    so do decodes, in bf16 with head_dim 64 through the compiled CPU kernel where it
    runs (kernels/cpu_kernels)."""
    import kernels.attention as attention

    held = {torch.float32, torch.bfloat16} if scores == "held-whole" else set()
    monkeypatch.setattr(attention, "_HELD_WHOLE_DTYPES", held)
    q, k_cache, v_cache, meta, (queries, dense_k, dense_v) = build_step(
        shapes, num_heads, num_kv_heads, head_dim, dtype, num_blocks=256
    )
    out = paged_attention(q, k_cache, v_cache, meta, head_dim**-0.5)
    for i, (L, n) in enumerate(shapes):
        ref = dense_attention(
            queries[i].float(), dense_k[i].float(), dense_v[i].float(), head_dim**-0.5
        )
        got = out[meta.query_start_loc[i] : meta.query_start_loc[i + 1]].float()
        assert (got - ref).abs().max().item() < tol, (L, n)


@pytest.mark.parametrize(
    "shapes", [MIXED, LONE_DECODE, DECODES], ids=["mixed", "lone-decode", "decodes"]
)
@pytest.mark.parametrize("scores", ["held-whole", "flash"])
@pytest.mark.parametrize("window", [None, 20])
def test_fp32_queries_over_a_bf16_cache_attend_its_widened_values(
    shapes, scores, window, monkeypatch
):
    """An fp32 model over a bf16 KV cache (EngineConfig.kv_dtype) computes in fp32 on
    the cache's values: every way a step attends gives what it gives over an fp32 cache
    holding the same values, and K/V are rounded as torch rounds them when stored."""
    import kernels.attention as attention

    held = {torch.float32, torch.bfloat16} if scores == "held-whole" else set()
    monkeypatch.setattr(attention, "_HELD_WHOLE_DTYPES", held)
    q, k_cache, v_cache, meta, _ = build_step(shapes, 6, 2, 64, torch.float32, num_blocks=256)
    k16, v16 = k_cache.bfloat16(), v_cache.bfloat16()
    keys = torch.randn(len(meta.slot_mapping), 2, 64)
    store_kvcache(keys, -keys, k16, v16, meta.slot_mapping)
    store_kvcache(keys, -keys, k_cache, v_cache, meta.slot_mapping)
    assert torch.equal(k16.float(), k_cache.bfloat16().float())  # round to nearest even
    got = paged_attention(q, k16, v16, meta, 0.125, window)
    want = paged_attention(q, k16.float(), v16.float(), meta, 0.125, window)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_store_kvcache_skips_negative_slots():
    k_cache = torch.zeros(2, 4, 1, 2)
    v_cache = torch.zeros_like(k_cache)
    key = torch.arange(6.0).view(3, 1, 2)
    store_kvcache(key, -key, k_cache, v_cache, torch.tensor([5, -1, 0]))
    flat = k_cache.view(-1, 1, 2)
    assert flat[5].tolist() == [[0.0, 1.0]]
    assert flat[0].tolist() == [[4.0, 5.0]]
    assert v_cache.view(-1, 1, 2)[0].tolist() == [[-4.0, -5.0]]
    assert flat.abs().sum().item() == 0 + 1 + 4 + 5  # nothing else written
    meta = AttentionMetadata(torch.tensor([5, -1, 0]), torch.zeros(1, 1), [0, 3], [3])
    assert not meta.all_slots_valid
    assert AttentionMetadata(torch.tensor([5, 0]), torch.zeros(1, 1), [0, 2], [2]).all_slots_valid


def _meta(n, length):
    return AttentionMetadata(torch.zeros(n), torch.zeros(1, 1), [0, n], [length])


@pytest.mark.parametrize("way", ["held-whole", "one-masked-call", "prefix-then-self"])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (9, 3)])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("n,length", [(68, 1368), (5, 600), (2, 40), (30, 31)])
def test_chunk_over_a_cached_prefix_is_causal_attention(
    way, num_heads, num_kv_heads, dtype, tol, n, length
):
    """Every way of attending a chunk to its cached prefix and to itself (the scores
    held whole; one masked flash call; two unmasked flash calls merged by
    log-sum-exp) is causal attention, exact in fp32, with the heads of a KV group
    folded together."""
    torch.manual_seed(n)
    dim = 16
    q = torch.randn(n, num_heads, dim)
    k = torch.randn(length, num_kv_heads, dim)
    v = torch.randn(length, num_kv_heads, dim)
    qd, kd, vd = q.to(dtype), k.to(dtype), v.to(dtype)
    group = num_heads // num_kv_heads
    if way == "held-whole":
        mask = _meta(n, length).chunk_mask(n, group, dtype)
        head_major = kd.transpose(0, 1).contiguous(), vd.transpose(0, 1).contiguous()
        got = _attend_held_whole(qd, *head_major, mask, dim**-0.5)
    elif way == "one-masked-call":  # flash on CPU, SDPA elsewhere
        mask = _meta(n, length).prefix_mask(0, group, dtype)
        got = _attend_over_prefix(qd, kd, vd, mask, dim**-0.5)
    else:
        got = _attend_prefix_then_self(qd, kd, vd, dim**-0.5)
    ref = dense_attention(q, k, v, dim**-0.5)
    assert got.shape == (n, num_heads, dim)
    assert (got.float() - ref).abs().max().item() < tol


def test_a_chunk_takes_each_cpu_path_by_its_size(monkeypatch):
    """Scores held whole (bf16 without AMX), else one masked flash call, and past the
    mask size limit the unmasked pair of flash calls: each is taken where it should
    be and all give the same result."""
    import kernels.attention as attention

    torch.manual_seed(3)
    bs, n, length, heads, kv_heads, dim = 4, 6, 50, 6, 2, 8
    k_cache = torch.randn(16, bs, kv_heads, dim)
    v_cache = torch.randn_like(k_cache)
    table = torch.randperm(16)[: -(-length // bs)]
    meta = AttentionMetadata(torch.zeros(n, dtype=torch.long), table[None], [0, n], [length])
    q = torch.randn(n, heads, dim)
    calls = []
    for name in ("_attend_held_whole", "_attend_over_prefix", "_attend_prefix_then_self"):
        real = getattr(attention, name)
        monkeypatch.setattr(
            attention, name, lambda *a, name=name, real=real: calls.append(name) or real(*a)
        )
    monkeypatch.setattr(attention, "_HELD_WHOLE_DTYPES", {torch.float32})
    held = paged_attention(q, k_cache, v_cache, meta, dim**-0.5)
    monkeypatch.setattr(attention, "_MAX_SCORES", heads * n * length - 1)
    masked = paged_attention(q, k_cache, v_cache, meta, dim**-0.5)
    monkeypatch.setattr(attention, "_MAX_PREFIX_MASK", n * length)
    two = paged_attention(q, k_cache, v_cache, meta, dim**-0.5)
    assert calls == ["_attend_held_whole", "_attend_over_prefix", "_attend_prefix_then_self"]
    assert (held - masked).abs().max().item() < 1e-5
    assert (held - two).abs().max().item() < 1e-5


def test_bf16_scores_are_held_whole_unless_the_cpu_has_amx():
    import kernels.attention as attention
    from kernels.cpu_features import has_amx

    assert attention.held_whole_dtypes(amx=False) == {torch.bfloat16}
    assert attention.held_whole_dtypes(amx=True) == set()
    assert attention.held_whole_dtypes(has_amx()) == attention._HELD_WHOLE_DTYPES
