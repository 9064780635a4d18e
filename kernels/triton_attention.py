"""Triton kernels for the GPU path: KV store and paged attention.

The attention kernel serves prefill chunks over a cached prefix and decode tokens
in one launch: one program per (sequence, query head, tile of query tokens) walks
the sequence's block table, one KV block at a time, with an online softmax.
Grouped-query attention maps query head h to KV head h // group.

On CPU these run under TRITON_INTERPRET=1 (tests); kernels/attention.py is the oracle.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.attention import AttentionMetadata


@triton.jit
def _store_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_key, stride_value,
    D: tl.constexpr,  # kv_heads * head_dim, contiguous in both source and cache
    BLOCK_D: tl.constexpr,  # D rounded up to a power of two (tl.arange needs one)
):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token)
    if slot >= 0:
        offs = tl.arange(0, BLOCK_D)
        inside = offs < D
        k = tl.load(key_ptr + token * stride_key + offs, mask=inside)
        v = tl.load(value_ptr + token * stride_value + offs, mask=inside)
        tl.store(k_cache_ptr + slot * D + offs, k.to(k_cache_ptr.dtype.element_ty), mask=inside)
        tl.store(v_cache_ptr + slot * D + offs, v.to(v_cache_ptr.dtype.element_ty), mask=inside)


def store_kvcache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    num_tokens, kv_heads, head_dim = key.shape
    d = kv_heads * head_dim
    key, value = key.reshape(num_tokens, d), value.reshape(num_tokens, d)
    assert key.stride(1) == 1 and value.stride(1) == 1 and k_cache.is_contiguous()
    _store_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping, key.stride(0), value.stride(0),
        D=d, BLOCK_D=triton.next_power_of_2(d),
    )


def supports_attention(block_size: int) -> bool:
    """The attention kernel takes one KV block per tl.dot, whose operands need at
    least 16 rows and a power-of-two count: other block sizes use the torch ops."""
    return block_size >= 16 and block_size & (block_size - 1) == 0


@triton.jit
def _paged_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr,
    block_tables_ptr, query_start_loc_ptr, seq_lens_ptr,
    scale,
    stride_qt, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_ot, stride_oh,
    stride_bt,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,  # HEAD_DIM rounded up to a power of two; the rest is masked
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    tile = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if tile * BLOCK_M < q_len:
        ctx = tl.load(seq_lens_ptr + seq)
        kv_head = head // GROUP
        offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        d_valid = offs_d < HEAD_DIM
        offs_n = tl.arange(0, BLOCK_SIZE)
        m_valid = offs_m < q_len
        # Padded head dims load as 0: they add nothing to q.k, and their output isn't stored.
        q = tl.load(
            q_ptr + (q_start + offs_m)[:, None] * stride_qt + head * stride_qh + offs_d[None, :],
            mask=m_valid[:, None] & d_valid[None, :], other=0.0,
        ).to(tl.float32)
        q_pos = ctx - q_len + offs_m  # absolute positions of this tile's queries
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        # Keys past this tile's last query are masked for every row: skip their blocks.
        last = tl.minimum(ctx, ctx - q_len + (tile + 1) * BLOCK_M)
        for b in range(0, tl.cdiv(last, BLOCK_SIZE)):
            # In int64: the offset passes 2**31 once one layer's K cache tops 4 GiB in bf16.
            block = tl.load(block_tables_ptr + seq * stride_bt + b).to(tl.int64)
            base = block * stride_kb + kv_head * stride_kh
            kv_offs = offs_n[:, None] * stride_ks + offs_d[None, :]
            k = tl.load(k_cache_ptr + base + kv_offs, mask=d_valid[None, :], other=0.0)
            v = tl.load(v_cache_ptr + base + kv_offs, mask=d_valid[None, :], other=0.0)
            k, v = k.to(tl.float32), v.to(tl.float32)
            s = tl.dot(q, tl.trans(k)) * scale
            k_pos = b * BLOCK_SIZE + offs_n
            keep = (k_pos[None, :] <= q_pos[:, None]) & (k_pos[None, :] < ctx)
            s = tl.where(keep, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p, v)
            m_i = m_new
        out = acc / l_i[:, None]
        tl.store(
            out_ptr + (q_start + offs_m)[:, None] * stride_ot + head * stride_oh + offs_d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=m_valid[:, None] & d_valid[None, :],
        )


def paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    block_m: int = 16,
) -> torch.Tensor:
    """Same contract as kernels.attention.paged_attention."""
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[2]
    block_size = k_cache.shape[1]
    out = torch.empty_like(query)
    device = query.device
    qsl = torch.tensor(meta.query_start_loc, dtype=torch.int32, device=device)
    lens = torch.tensor(meta.seq_lens, dtype=torch.int32, device=device)
    tables = meta.block_tables.to(device=device, dtype=torch.int32).contiguous()
    max_q = max(meta.query_lens)
    grid = (len(meta.seq_lens), num_heads, triton.cdiv(max_q, block_m))
    _paged_attention_kernel[grid](
        query, k_cache, v_cache, out, tables, qsl, lens, scale,
        query.stride(0), query.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        out.stride(0), out.stride(1),
        tables.stride(0),
        GROUP=num_heads // num_kv_heads,
        BLOCK_M=block_m,
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim),
    )
    return out
