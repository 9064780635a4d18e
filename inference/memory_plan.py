"""What a model's weights and its KV pool take, against the memory the host has.

A start that asks for more than the host has is refused with the numbers before any
weight is read, rather than killed by the kernel halfway; the KV pool is cut to what
is left after the weights (it is mapped as written, so a pool too large would start
fine and fail once its blocks fill); optional copies (the bf16 copy of quantized
weights that many-row matmuls read) are left out where they would not fit.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

# Left free for the process's own heap, the tokenizer, activations and the OS.
HEADROOM_BYTES = 512 << 20
# The fewest tokens a pool is cut to; below this the start is refused.
MIN_POOL_TOKENS = 256


class ModelDoesNotFitError(ValueError):
    pass


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_weights_fit(name: str, weight_bytes: int, available: int | None) -> None:
    """ModelDoesNotFitError where the weights alone (and the headroom) exceed what the
    host has available; nothing is checked where the host does not say (None)."""
    if available is None:
        return
    if weight_bytes + HEADROOM_BYTES > available:
        raise ModelDoesNotFitError(
            f"{name} needs about {_gib(weight_bytes)} for its weights, and this host has "
            f"{_gib(available)} available: pick a smaller model or a smaller quantization "
            "(a Q4_K_M file is about 0.6 bytes a parameter)")


def pool_blocks(requested: int, bytes_per_block: int, block_tokens: int,
                available: int | None) -> int:
    """The KV pool's blocks: those asked for, cut to what the memory left after the
    weights holds (with the headroom); ModelDoesNotFitError where that is fewer than
    MIN_POOL_TOKENS tokens."""
    if available is None:
        return requested
    fits = max(0, (available - HEADROOM_BYTES) // bytes_per_block)
    if fits >= requested:
        return requested
    if fits * block_tokens < MIN_POOL_TOKENS:
        raise ModelDoesNotFitError(
            f"after the weights this host has {_gib(available)} available, room for "
            f"{fits * block_tokens} tokens of KV cache ({_gib(bytes_per_block)} a block of "
            f"{block_tokens}): at least {MIN_POOL_TOKENS} are needed; pick a smaller model "
            "or quantization")
    log.warning("the KV pool is cut from %d to %d blocks (%d tokens) to fit the %s this "
                "host has available after the weights", requested, fits, fits * block_tokens,
                _gib(available))
    return int(fits)


def copies_fit(copy_bytes: int, pool_bytes: int, available: int | None) -> bool:
    """Whether an optional copy of copy_bytes fits beside the pool yet to fill."""
    return available is None or copy_bytes + pool_bytes + HEADROOM_BYTES <= available
