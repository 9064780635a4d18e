"""8-bit K/V rows: the int8 KV cache (EngineConfig.kv_dtype="int8") of the fp32 CPU paths.

A row is one token's K or V of one KV head: head_dim int8 values, then their fp32 scale
(the row's largest magnitude / 127), stored as head_dim + 4 bytes of a uint8 pool
[2, layers, blocks, block_size, kv_heads, head_dim + 4]. A value reads back as
int8 * scale. Rows take a quarter of fp32's bytes and about half of bf16's, so the same
pool holds twice the tokens of a bf16 one and a decode step streams half the bytes.

The C step (kernels/csrc/f32/decode.c) stores and reads the same rows, rounding as
quantize does here, bit for bit, so a block's bytes do not depend on which path wrote it.
"""

from __future__ import annotations

import torch

# The pool's element type: rows of bytes (int8 values, then a float's four bytes).
POOL_DTYPE = torch.uint8
SCALE_BYTES = 4


def is_quantized(cache: torch.Tensor) -> bool:
    """Whether a cache holds int8 rows (else values of a float dtype)."""
    return cache.dtype == POOL_DTYPE


def row_width(head_dim: int) -> int:
    """A row's bytes for head_dim values."""
    return head_dim + SCALE_BYTES


def pool_last_axis(head_dim: int, dtype: torch.dtype) -> int:
    """The last axis of a KV pool of dtype: a row of int8 and its scale, else head_dim."""
    return row_width(head_dim) if dtype == POOL_DTYPE else head_dim


def head_dim_of(cache: torch.Tensor) -> int:
    """The head_dim of a cache's rows, quantized or not."""
    return cache.shape[-1] - SCALE_BYTES if is_quantized(cache) else cache.shape[-1]


def quantize(x: torch.Tensor) -> torch.Tensor:
    """Rows x [..., head_dim] (any float dtype) as int8 rows [..., head_dim + 4] uint8:
    scale = amax / 127 in fp32, values x / scale rounded to nearest even (an all-zero
    row: scale 0, values 0)."""
    x = x.float()
    scale = x.abs().amax(dim=-1, keepdim=True) / 127.0
    q = torch.where(scale > 0, x / scale, 0.0).round_().clamp_(-127, 127).to(torch.int8)
    return torch.cat((q.view(POOL_DTYPE), scale.view(POOL_DTYPE)), dim=-1)


def dequantize(rows: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """int8 rows [..., head_dim + 4] uint8 (contiguous in their last axis) as values
    [..., head_dim] in dtype: int8 * scale, in fp32."""
    values = rows[..., :-SCALE_BYTES].view(torch.int8)
    scale = rows[..., -SCALE_BYTES:].contiguous().view(torch.float32)
    out = values.to(torch.float32).mul_(scale)
    return out if dtype == torch.float32 else out.to(dtype)
