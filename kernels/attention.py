"""Torch reference ops for attention over a paged KV cache.

Layout (as nano-vllm): one cache tensor per layer for K and one for V, shaped
[num_blocks, block_size, num_kv_heads, head_dim]. A token's slot is
block_id * block_size + offset; slot -1 means "don't store".

These are the oracle for faster kernels and the CPU path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class AttentionMetadata:
    """How the flat batch of query tokens maps onto sequences and KV blocks.

    Sequences are ordered: those with several query tokens (prefill chunks) and
    those with one (decode) may be mixed; `query_lens` says which is which.
    """

    slot_mapping: torch.Tensor  # [num_tokens] int64, -1 = skip
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int64, padded with 0
    query_start_loc: list[int]  # len num_seqs + 1, offsets into the token batch
    seq_lens: list[int]  # context length per sequence after this step (cached + new)

    @property
    def query_lens(self) -> list[int]:
        q = self.query_start_loc
        return [q[i + 1] - q[i] for i in range(len(q) - 1)]


def store_kvcache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write key/value [num_tokens, kv_heads, head_dim] into their cache slots."""
    num_kv_heads, head_dim = key.shape[1], key.shape[2]
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key.to(k_cache.dtype))
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value.to(v_cache.dtype))


def gather_kv(
    cache: torch.Tensor, block_table: torch.Tensor, length: int
) -> torch.Tensor:
    """The first `length` tokens of one sequence's K or V: [length, kv_heads, head_dim]."""
    block_size = cache.shape[1]
    num_blocks = (length + block_size - 1) // block_size
    blocks = cache.index_select(0, block_table[:num_blocks])
    return blocks.flatten(0, 1)[:length]


def paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Causal attention of every query token over its sequence's cached context.

    query: [num_tokens, num_heads, head_dim]. A sequence with q query tokens and
    context length L holds positions L-q .. L-1; query j sees keys 0 .. L-q+j.
    Grouped-query attention: num_heads is a multiple of the cache's kv heads.
    """
    out = torch.empty_like(query)
    qlens = meta.query_lens
    decode_rows = [i for i, n in enumerate(qlens) if n == 1]
    for i, n in enumerate(qlens):
        if n == 1 and len(decode_rows) > 1:
            continue  # batched below
        start, length = meta.query_start_loc[i], meta.seq_lens[i]
        q = query[start : start + n].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
        k = gather_kv(k_cache, meta.block_tables[i], length).transpose(0, 1).unsqueeze(0)
        v = gather_kv(v_cache, meta.block_tables[i], length).transpose(0, 1).unsqueeze(0)
        if n == length:
            mask = None
            causal = n > 1
        else:
            q_pos = torch.arange(length - n, length, device=query.device)
            mask = torch.arange(length, device=query.device)[None, :] <= q_pos[:, None]
            causal = False
        o = F.scaled_dot_product_attention(
            q.to(k.dtype), k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True
        )
        out[start : start + n] = o[0].transpose(0, 1).to(out.dtype)
    if len(decode_rows) > 1:
        _batched_decode(query, k_cache, v_cache, meta, decode_rows, scale, out)
    return out


def _batched_decode(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    rows: list[int],
    scale: float,
    out: torch.Tensor,
) -> None:
    """One attention call for all single-token queries, padded to the longest context."""
    block_size = k_cache.shape[1]
    lens = [meta.seq_lens[i] for i in rows]
    max_len = max(lens)
    max_blocks = (max_len + block_size - 1) // block_size
    idx = torch.tensor(rows, device=query.device)
    tables = meta.block_tables.index_select(0, idx)[:, :max_blocks]  # [B, nb]
    b = len(rows)
    k = k_cache[tables].reshape(b, max_blocks * block_size, *k_cache.shape[2:])[:, :max_len]
    v = v_cache[tables].reshape(b, max_blocks * block_size, *v_cache.shape[2:])[:, :max_len]
    lens_t = torch.tensor(lens, device=query.device)
    mask = torch.arange(max_len, device=query.device)[None, :] < lens_t[:, None]  # [B, L]
    token_idx = torch.tensor([meta.query_start_loc[i] for i in rows], device=query.device)
    q = query.index_select(0, token_idx).unsqueeze(2)  # [B, H, 1, D]
    o = F.scaled_dot_product_attention(
        q.to(k.dtype),
        k.transpose(1, 2),
        v.transpose(1, 2),
        attn_mask=mask[:, None, None, :],
        scale=scale,
        enable_gqa=True,
    )
    out.index_copy_(0, token_idx, o[:, :, 0].to(out.dtype))
