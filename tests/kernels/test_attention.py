"""The torch reference ops against plain dense causal attention."""

import pytest
import torch

from kernels.attention import (
    AttentionMetadata,
    _attend_low_precision,
    _attend_prefix_then_self,
    _prefix_path,
    _use_low_precision_path,
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


# (context length, query tokens): whole prefill, prefill over a cached prefix,
# several decodes, ragged lengths; (45, 12) is long enough for the low-precision
# matmul path in bf16, (40, 40) is a whole prompt, which stays with SDPA, and
# (530, 7) has a cached prefix long enough for the two flash calls.
MIXED = [(9, 9), (13, 5), (7, 1), (17, 1), (1, 1), (30, 3), (45, 12), (40, 40), (530, 7)]
# A lone decode, and a step of ragged decodes only (the decode-only fast path).
LONE_DECODE = [(140, 1)]
DECODES = [(7, 1), (17, 1), (33, 1), (5, 1), (33, 1)]


@pytest.mark.parametrize(
    "shapes", [MIXED, LONE_DECODE, DECODES], ids=["mixed", "lone-decode", "decodes"]
)
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (6, 2)])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_paged_attention_matches_dense(shapes, num_heads, num_kv_heads, dtype, tol):
    torch.manual_seed(0)
    bs, head_dim, num_blocks = 4, 8, 256
    k_cache = torch.zeros(num_blocks, bs, num_kv_heads, head_dim, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    perm = torch.randperm(num_blocks).tolist()  # out-of-order blocks
    tables, dense_k, dense_v, queries, slots = [], [], [], [], []
    qsl, seq_lens = [0], []
    for L, n in shapes:
        nb = -(-L // bs)
        table = [perm.pop() for _ in range(nb)]
        tables.append(table)
        k = torch.randn(L, num_kv_heads, head_dim, dtype=dtype)
        v = torch.randn(L, num_kv_heads, head_dim, dtype=dtype)
        # The cached part is already in the pool; the new part is stored by store_kvcache.
        for pos in range(L - n):
            k_cache[table[pos // bs], pos % bs] = k[pos]
            v_cache[table[pos // bs], pos % bs] = v[pos]
        dense_k.append(k)
        dense_v.append(v)
        queries.append(torch.randn(n, num_heads, head_dim, dtype=dtype))
        slots += [table[p // bs] * bs + p % bs for p in range(L - n, L)]
        qsl.append(qsl[-1] + n)
        seq_lens.append(L)
    width = max(map(len, tables))
    bt = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    meta = AttentionMetadata(torch.tensor(slots), bt, qsl, seq_lens)
    new_k = torch.cat([k[L - n:] for k, (L, n) in zip(dense_k, shapes, strict=True)])
    new_v = torch.cat([v[L - n:] for v, (L, n) in zip(dense_v, shapes, strict=True)])
    store_kvcache(new_k, new_v, k_cache, v_cache, meta.slot_mapping)
    q = torch.cat(queries)
    out = paged_attention(q, k_cache, v_cache, meta, head_dim**-0.5)
    for i, (L, n) in enumerate(shapes):
        ref = dense_attention(queries[i].float(), dense_k[i].float(), dense_v[i].float(),
                              head_dim**-0.5)
        got = out[qsl[i]:qsl[i + 1]].float()
        assert (got - ref).abs().max().item() < tol, (L, n)


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


def test_low_precision_path_is_chosen_for_a_chat_turn_and_matches_dense():
    """A 68-token turn over ~1,000 cached tokens in bf16 takes the matmul path
    (fp32 always keeps SDPA), and that path is causal attention over the prefix."""
    assert _use_low_precision_path(torch.bfloat16, 68, 1060)
    assert not _use_low_precision_path(torch.float32, 68, 1060)
    assert not _use_low_precision_path(torch.bfloat16, 1, 1060)  # decode is batched elsewhere
    assert not _use_low_precision_path(torch.bfloat16, 512, 512)  # flash wins there
    assert not _use_low_precision_path(torch.bfloat16, 128, 128)  # and on any whole prompt
    torch.manual_seed(1)
    n, length, heads, kv_heads, dim = 20, 70, 9, 3, 16
    q = torch.randn(n, heads, dim)
    k = torch.randn(length, kv_heads, dim)
    v = torch.randn(length, kv_heads, dim)
    future = torch.ones(n, n, dtype=torch.bool).triu(1)
    got = _attend_low_precision(q.bfloat16(), k.bfloat16(), v.bfloat16(), future, dim**-0.5)
    ref = dense_attention(q, k, v, dim**-0.5)
    assert (got.float() - ref).abs().max().item() < 3e-2


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (9, 3)])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("n,length", [(68, 1368), (5, 600), (2, 40), (30, 31)])
def test_prefix_then_self_in_two_flash_calls_is_causal_attention(
    num_heads, num_kv_heads, dtype, tol, n, length
):
    """Attending to the cached prefix and to the chunk itself separately, merged by
    log-sum-exp, is the same causal attention (exact in fp32)."""
    torch.manual_seed(n)
    dim = 16
    q = torch.randn(n, num_heads, dim)
    k = torch.randn(length, num_kv_heads, dim)
    v = torch.randn(length, num_kv_heads, dim)
    got = _attend_prefix_then_self(q.to(dtype), k.to(dtype), v.to(dtype), dim**-0.5)
    ref = dense_attention(q, k, v, dim**-0.5)
    assert got.shape == (n, num_heads, dim)
    assert (got.float() - ref).abs().max().item() < tol


def test_prefix_path_choice():
    assert _prefix_path(torch.bfloat16, 68, 1368) == "split"  # long prefix
    assert _prefix_path(torch.float32, 68, 1368) == "split"
    assert _prefix_path(torch.bfloat16, 68, 300) == "matmul"  # short prefix
    assert _prefix_path(torch.float32, 68, 300) is None  # masked SDPA
    assert _prefix_path(torch.bfloat16, 128, 128) is None  # a whole prompt: causal SDPA
    assert _prefix_path(torch.bfloat16, 1, 900) is None  # decode goes elsewhere
