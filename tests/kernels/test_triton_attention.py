"""Triton kernels against the torch reference (interpreted on CPU, native on CUDA)."""

from __future__ import annotations

import random

import pytest
import torch

triton = pytest.importorskip("triton")

from kernels import attention as reference  # noqa: E402
from kernels import triton_attention  # noqa: E402
from kernels.attention import AttentionMetadata  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def build_batch(shapes, num_heads, num_kv_heads, head_dim, dtype, bs=16, seed=0):
    """Random paged batch: ragged lengths, out-of-order blocks, two sequences sharing
    their first block, prefill chunks over cached context and decodes mixed."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    num_blocks = sum(-(-L // bs) for L, _ in shapes) + 8
    ids = list(range(num_blocks))
    rng.shuffle(ids)
    k_cache = torch.randn(num_blocks, bs, num_kv_heads, head_dim, dtype=dtype, device=DEVICE)
    v_cache = torch.randn_like(k_cache)
    tables = []
    for i, (L, _) in enumerate(shapes):
        table = [ids.pop() for _ in range(-(-L // bs))]
        if i == 1 and tables:
            table[0] = tables[0][0]  # a shared prefix block
        tables.append(table)
    width = max(map(len, tables))
    bt = torch.tensor([t + [0] * (width - len(t)) for t in tables], device=DEVICE)
    qsl, lens, slots = [0], [], []
    for (L, n), table in zip(shapes, tables, strict=True):
        qsl.append(qsl[-1] + n)
        lens.append(L)
        slots += [table[p // bs] * bs + p % bs for p in range(L - n, L)]
    meta = AttentionMetadata(torch.tensor(slots, device=DEVICE), bt, qsl, lens)
    q = torch.randn(qsl[-1], num_heads, head_dim, dtype=dtype, device=DEVICE)
    return q, k_cache, v_cache, meta


SHAPES = [(40, 40), (37, 5), (16, 1), (70, 1), (1, 1), (33, 17), (5, 2)]


@pytest.mark.parametrize("num_heads,num_kv_heads", [(2, 2), (6, 2)])  # GQA ratio 1 and 3
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-4), (torch.bfloat16, 2e-2)])
def test_paged_attention_matches_reference(num_heads, num_kv_heads, dtype, tol):
    head_dim = 16
    q, k_cache, v_cache, meta = build_batch(SHAPES, num_heads, num_kv_heads, head_dim, dtype)
    scale = head_dim**-0.5
    ref = reference.paged_attention(q, k_cache, v_cache, meta, scale).float()
    got = triton_attention.paged_attention(q, k_cache, v_cache, meta, scale).float()
    assert (got - ref).abs().max().item() < tol


def test_paged_attention_with_a_head_dim_that_is_not_a_power_of_two():
    """The kernel pads head_dim to a power of two (tl.arange needs one) and masks the rest."""
    head_dim = 24
    q, k_cache, v_cache, meta = build_batch(SHAPES, 6, 2, head_dim, torch.float32)
    ref = reference.paged_attention(q, k_cache, v_cache, meta, head_dim**-0.5)
    got = triton_attention.paged_attention(q, k_cache, v_cache, meta, head_dim**-0.5)
    assert (got - ref).abs().max().item() < 2e-4


def test_block_sizes_the_attention_kernel_cannot_take_use_the_torch_ops(monkeypatch):
    """tl.dot needs 16+ rows, a power of two: such caches take the reference on CUDA too."""
    import kernels

    assert [triton_attention.supports_attention(b) for b in (8, 16, 24, 32)] == [
        False,
        True,
        False,
        True,
    ]
    monkeypatch.setattr(kernels, "_use_triton", lambda t: True)
    launched = []
    monkeypatch.setattr(triton_attention, "paged_attention", lambda *a: launched.append(a))
    q, k_cache, v_cache, meta = build_batch(SHAPES, 2, 2, 16, torch.float32, bs=8)
    got = kernels.paged_attention(q, k_cache, v_cache, meta, 0.25)
    assert not launched
    assert torch.equal(got, reference.paged_attention(q, k_cache, v_cache, meta, 0.25))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kv_heads,head_dim", [(2, 16), (3, 64)])  # 32 and 192 per token
def test_store_kvcache_matches_reference(dtype, kv_heads, head_dim):
    q, k_cache, v_cache, meta = build_batch(SHAPES[:4], kv_heads, kv_heads, head_dim, dtype)
    n = meta.slot_mapping.shape[0]
    key = torch.randn(n, kv_heads, head_dim, dtype=dtype, device=DEVICE)
    value = torch.randn_like(key)
    slots = meta.slot_mapping.clone()
    slots[3] = -1  # skipped
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    reference.store_kvcache(key, value, k_ref, v_ref, slots)
    triton_attention.store_kvcache(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
