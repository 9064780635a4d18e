"""Attention and KV-store ops: Triton on CUDA, the torch reference elsewhere."""

from __future__ import annotations

import torch

from kernels import attention as reference
from kernels.attention import AttentionMetadata

__all__ = ["AttentionMetadata", "paged_attention", "store_kvcache", "triton_available"]


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _use_triton(t: torch.Tensor) -> bool:
    return t.is_cuda and triton_available()


def store_kvcache(key, value, k_cache, v_cache, slot_mapping, all_valid=None) -> None:
    if _use_triton(key):
        from kernels import triton_attention

        # The kernel checks each slot itself.
        return triton_attention.store_kvcache(key, value, k_cache, v_cache, slot_mapping)
    return reference.store_kvcache(key, value, k_cache, v_cache, slot_mapping, all_valid)


def paged_attention(query, k_cache, v_cache, meta: AttentionMetadata, scale: float,
                    window: int | None = None):
    """Causal attention over the paged cache; `window`: a sliding-window layer's
    window (the torch path masks it: the Triton kernel has none)."""
    if _use_triton(query) and not reference.window_applies(meta, window):
        from kernels import triton_attention

        if triton_attention.supports_attention(k_cache.shape[1]):
            return triton_attention.paged_attention(query, k_cache, v_cache, meta, scale)
    return reference.paged_attention(query, k_cache, v_cache, meta, scale, window)
